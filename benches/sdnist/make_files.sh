#!/usr/bin/env bash
# Writes the three synthetic files of tests/data/sdnist/ (2000 rows each, seeded:
# NOT private, test inputs only) from the ma2019 excerpt, then the expected
# k-marginal scores with SDNist (see kmarginal_reference.py for its venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
dom=tests/data/sdnist/kmarginal.domain.yaml
for m in independent mst privbayes; do
  rm -rf "tests/data/sdnist/$m.csv"
  cargo run -q -- synth --input sample_data/nist-acs/ma2019.csv --domain "$dom" --mechanism "$m" \
    --epsilon 2 --delta 1e-6 --rows 2000 --unsafe-seed 7 --workload all-2way \
    --out "tests/data/sdnist/$m.csv" --record-out "/tmp/sdnist-$m.record.json"
done
"${PYTHON:-python3}" benches/sdnist/kmarginal_reference.py > tests/data/sdnist/expected.json
