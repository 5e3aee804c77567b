#!/usr/bin/env bash
# Marginal counting benchmark (issue #4): all 2-way marginals of the 16-column
# bench-data table at 1M, 10M and 100M rows, with dpflow's MarginalExec vs one
# DataFusion GROUP BY per marginal vs one GROUPING SETS query. Reports wall
# time, rows/s (per core) and peak RSS (from `dpflow-bench` and /usr/bin/time).
#
#   cargo build --release --workspace && benches/marginals.sh [ROWS...]
set -euo pipefail
BENCH=${DPFLOW_BENCH_BIN:-target/release/dpflow-bench}
OUT=${BENCH_DIR:-bench_out}
mkdir -p "$OUT"
ROWS=${*:-1000000 10000000 100000000}
for n in $ROWS; do
  f="$OUT/bench-$n.parquet"
  if [ ! -f "$f" ]; then
    /usr/bin/time -f "bench-data $n rows: %e s, peak RSS %M KB" "$BENCH" bench-data --rows "$n" --out "$f" --domain-out "$OUT/bench.yaml" --seed 0
  fi
  for engine in exec grouping-sets group-by; do
    if [ "$engine" = "group-by" ] && [ "$n" -gt 10000000 ] && [ -z "${BENCH_SLOW:-}" ]; then
      echo "skipping separate GROUP BYs at $n rows (set BENCH_SLOW=1)"; continue
    fi
    if [ "$engine" = "grouping-sets" ] && [ "$n" -gt 10000000 ]; then
      echo "skipping GROUPING SETS at $n rows (it needed 21 GB of RAM at 10M rows)"; continue
    fi
    /usr/bin/time -f "  /usr/bin/time: %e s wall, %M KB peak RSS" "$BENCH" marginals --input "$f" --domain "$OUT/bench.yaml" --k 2 --engine "$engine"
  done
done
