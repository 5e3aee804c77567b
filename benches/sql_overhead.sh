#!/usr/bin/env bash
# DP SQL overhead (issue #7): the same grouped query on a 10M-row bench-data
# Parquet, as a DP query (protected table, dp_count/dp_avg, contribution
# bounding off: one row per unit) with `dpflow sql`, and as the plain query in
# DataFusion (`dpflow bench plain-sql`, the same binary, so process start-up is
# the same). Prints the median wall time of 5 runs each.
#
#   cargo build --release && benches/sql_overhead.sh [ROWS]
set -euo pipefail
BIN=${DPFLOW_BIN:-target/release/dpflow}
OUT=${BENCH_DIR:-bench_out}
N=${1:-10000000}
mkdir -p "$OUT"
f="$OUT/bench-$N.parquet"
[ -f "$f" ] || "$BIN" bench-data --rows "$N" --out "$f" --domain-out "$OUT/bench.yaml" --seed 0
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/catalog.yaml" <<YAML
ledger: ledger.sqlite
create_ledger_if_missing:
  people: {epsilon: 1.0e6}
tables:
  people: {location: $(realpath "$f"), domain: $(realpath "$OUT/bench.yaml"), privacy_unit: row}
YAML
time_it() {
  python3 - "$@" <<'PY'
import statistics, subprocess, sys, time
ts = []
for _ in range(5):
    t = time.time()
    subprocess.run(sys.argv[1:], check=True, capture_output=True)
    ts.append(time.time() - t)
print(f"{statistics.median(ts):.3f}")
PY
}
dp=$(time_it "$BIN" sql --catalog "$d/catalog.yaml" --epsilon 1 -e \
  "SELECT state, dp_count(*) AS n, dp_avg(hours, 0, 99) AS h FROM people GROUP BY state")
# The plain query in DataFusion (dpflow's SQL front end refuses non-DP queries by design).
plain=$(time_it "$BIN" bench plain-sql --input "$(realpath "$f")" --query \
  "SELECT state, count(*) AS n, avg(hours) AS h FROM t GROUP BY state")
echo "rows=$N dp_seconds=$dp plain_seconds=$plain ratio=$(python3 -c "print(round($dp/$plain, 3))")"
