#!/bin/bash
# The README tour's imputation example, 100 seeded releases (ε = 6 ln 2 per number):
# ma2019 with 15% of incomes made unknown (MAR, seed 7), then `dpflow impute`.
# Prints "mean_income_20_59 share_above_25750_40_49" per run.
#   DPFLOW=target/debug/dpflow benches/knn_tour.sh > benches/results/knn/tour-mar-100runs.txt
set -euo pipefail
DPFLOW=${DPFLOW:-target/release/dpflow}
mkdir -p out
"$DPFLOW" missing inject --input sample_data/nist-acs/ma2019.csv --domain sample_data/nist-acs/ma2019.domain.yaml \
  --mechanism mar --rate 0.15 --columns PINCP --unsafe-seed 7 --out out/ma2019-mar.csv >&2
for s in $(seq 1 100); do
  "$DPFLOW" impute --spec sample_data/nist-acs/impute-income.yaml --input out/ma2019-mar.csv \
    --unsafe-seed "$s" --format json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["results"]; print(r[0]["value"], r[1]["value"])'
done
