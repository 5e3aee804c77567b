#!/bin/bash
# kNN imputation at scale (issue 19 item 3): `dpflow impute` on bench data with 10M and 100M rows,
# income imputed from age (by decade), sex, race, education and marital status; four queries
# (a count, a mean, a proportion, a variance), ε = 6·ln 2 per number. Prints wall time, CPU time
# and peak RSS of each run, and the released values (seeded: not a private release).
#   BEFORE=/path/to/old/dpflow benches/knn_stream.sh /tmp/knn-bench
# (BEFORE is optional: a build of an earlier commit to compare with, run in the same session.)
set -euo pipefail
. "$(dirname "$0")/knn_spec.sh"
DIR=${1:-/tmp/knn-bench}
DPFLOW=${DPFLOW:-target/release/dpflow}
BENCH=${BENCH:-target/release/dpflow-bench}
mkdir -p "$DIR"
for rows in 10000000 100000000; do
  f="$DIR/b$rows.parquet"
  [ -f "$f" ] || "$BENCH" bench-data --rows "$rows" --out "$f" --domain-out "$DIR/bench.yaml" >&2
  knn_spec "b$rows.parquet" bench.yaml > "$DIR/impute-$rows.yaml"
  for bin in ${BEFORE:+before=$BEFORE} after="$DPFLOW"; do
    label=${bin%%=*}; path=${bin#*=}
    if [ "$label" = before ] && [ "$rows" -gt 10000000 ]; then continue; fi
    /usr/bin/time -f "$label rows=$rows wall_s=%e cpu_s=%U+%S peak_rss_kb=%M" \
      "$path" impute --spec "$DIR/impute-$rows.yaml" --unsafe-seed 1 --format json > "$DIR/$label-$rows.json"
    python3 -c 'import json,sys; print(" ".join(f"{r[\"name\"]}={r[\"value\"]}" for r in json.load(open(sys.argv[1]))["results"]))' \
      "$DIR/$label-$rows.json"
  done
done
