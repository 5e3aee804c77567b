#!/usr/bin/env bash
# DP SQL overhead (issue #7): the same grouped query on a 10M-row bench-data
# Parquet, as a DP query (protected table, dp_count/dp_avg, contribution
# bounding off: one row per unit) with `dpflow sql`, and as the plain query in
# DataFusion (`dpflow-bench plain-sql`, built with the same profile, so process start-up is
# the same). Prints the median wall time of RUNS interleaved runs each.
#
#   cargo build --release --workspace && benches/sql_overhead.sh [ROWS]
set -euo pipefail
BIN=${DPFLOW_BIN:-target/release/dpflow}
BENCH=${DPFLOW_BENCH_BIN:-target/release/dpflow-bench}
OUT=${BENCH_DIR:-bench_out}
N=${1:-10000000}
mkdir -p "$OUT"
f="$OUT/bench-$N.parquet"
[ -f "$f" ] || "$BENCH" bench-data --rows "$N" --out "$f" --domain-out "$OUT/bench.yaml" --seed 0
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/catalog.yaml" <<YAML
ledger: ledger.sqlite
create_ledger_if_missing:
  people: {epsilon: 1.0e6}
tables:
  people: {location: $(realpath "$f"), domain: $(realpath "$OUT/bench.yaml"), privacy_unit: row}
YAML
# Interleaved runs (DP, plain, DP, ...) so both see the same machine state;
# RUNS of each (default 21), medians.
RUNS=${RUNS:-21}
python3 - "$RUNS" "$BIN" "$d/catalog.yaml" "$(realpath "$f")" "$N" "$BENCH" <<'PY'
import statistics, subprocess, sys, time
runs, bin_, catalog, data, n, bench = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
dp = [bin_, "sql", "--catalog", catalog, "--epsilon", "1", "-e",
      "SELECT state, dp_count(*) AS n, dp_avg(hours, 0, 99) AS h FROM people GROUP BY state"]
# The plain query in DataFusion (dpflow's SQL front end refuses non-DP queries by design).
plain = [bench, "plain-sql", "--input", data, "--query",
         "SELECT state, count(*) AS n, avg(hours) AS h FROM t GROUP BY state"]
ts = {"dp": [], "plain": []}
subprocess.run(dp, check=True, capture_output=True)  # creates the ledger, warms the cache
for _ in range(runs):
    for k, cmd in (("dp", dp), ("plain", plain)):
        t = time.time()
        subprocess.run(cmd, check=True, capture_output=True)
        ts[k].append(time.time() - t)
a, b = statistics.median(ts["dp"]), statistics.median(ts["plain"])
print(f"rows={n} runs={runs} dp_seconds={a:.4f} plain_seconds={b:.4f} ratio={a / b:.3f}")
PY
