#!/usr/bin/env bash
# Scaling curves (issue 19, item 4): time and peak memory of MST, AIM, a DP SQL query, kNN
# imputation and the marginal operator against rows (bench data, 16 columns) and against columns
# (8, 16, 32 at a fixed row count). One process per measurement, timed by /usr/bin/time. The
# synthesizers and the imputation are seeded (--unsafe-seed: reproducible, not private); the SQL
# query is a real release charged to a throw-away ledger in the directory (dpflow refuses a seed
# with a ledger). Prints one TSV line per run:
#   axis rows columns task wall_s cpu_user_s cpu_sys_s peak_rss_mb
#
#   cargo build --release --workspace
#   benches/scale.sh                   # rows 1e6 1e7 1e8, columns 8 16 32 at 1e6
#   ROWS="1000000 10000000" WIDTHS="8 16 32" WIDTH_ROWS=1000000 TASKS="mst sql knn marginals" \
#     AIM_ROWS=1000000 benches/scale.sh /tmp/scale
# AIM (all-3way) runs only at AIM_ROWS rows (default 1e6; 1e7 takes ~15 minutes).
# The bench files (1 GB at 1e8 rows) stay in the directory for re-runs: delete them after.
set -euo pipefail
. "$(dirname "$0")/knn_spec.sh"
DIR=${1:-bench_out/scale}
BIN=$(realpath "${DPFLOW_BIN:-target/release/dpflow}")
BENCH=$(realpath "${DPFLOW_BENCH_BIN:-target/release/dpflow-bench}")
ROWS=${ROWS:-1000000 10000000 100000000}
WIDTHS=${WIDTHS:-8 16 32}
WIDTH_ROWS=${WIDTH_ROWS:-1000000}
AIM_ROWS=${AIM_ROWS:-1000000}
TASKS=${TASKS:-mst aim sql knn marginals}
mkdir -p "$DIR"
DIR=$(realpath "$DIR")

# data ROWS WIDTH -> path of the bench file (written once), its domain beside it.
data() {
  local f="$DIR/bench-$1-w$2.parquet"
  if [ ! -f "$f" ]; then
    "$BENCH" bench-data --rows "$1" --columns "$2" --seed 0 --out "$f" --domain-out "$DIR/bench-w$2.yaml" >&2
  fi
  echo "$f"
}

# measure AXIS ROWS WIDTH TASK CMD... : one timed run, one TSV line.
measure() {
  local axis=$1 rows=$2 width=$3 task=$4; shift 4
  local t="$DIR/time.txt"
  if ! /usr/bin/time -f "%e %U %S %M" -o "$t" "$@" > "$DIR/$task-$rows-w$width.out" 2> "$DIR/$task-$rows-w$width.err"; then
    echo "$task failed at $rows rows, $width columns: see $DIR/$task-$rows-w$width.err" >&2
    return 1
  fi
  read -r wall user sys rss < "$t"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n' "$axis" "$rows" "$width" "$task" "$wall" "$user" "$sys" $((rss / 1024))
}

run_task() {
  local axis=$1 rows=$2 width=$3 task=$4
  local f dom
  f=$(data "$rows" "$width")
  dom="$DIR/bench-w$width.yaml"
  case $task in
    mst | aim)
      measure "$axis" "$rows" "$width" "$task" "$BIN" synth --input "$f" --domain "$dom" --mechanism "$task" \
        --epsilon 1 --delta 1e-9 --workload all-3way --rows 100000 --unsafe-seed 0 --out "$DIR/synth.parquet" ;;
    sql)
      # Columns every width has: education (16 values) and age.
      cat > "$DIR/catalog.yaml" <<YAML
ledger: ledger-w$width-$rows.sqlite
create_ledger_if_missing:
  people: {epsilon: 1.0e6}
tables:
  people: {location: $f, domain: $dom, privacy_unit: row}
YAML
      measure "$axis" "$rows" "$width" sql "$BIN" sql --catalog "$DIR/catalog.yaml" --epsilon 1 -e \
        "SELECT education, dp_count(*) AS n, dp_avg(age, 0, 99) AS mean_age FROM people GROUP BY education" ;;
    knn)
      # Needs income (column 11): not at 8 columns.
      [ "$width" -ge 11 ] || return 0
      knn_spec "$f" "$dom" > "$DIR/impute.yaml"
      measure "$axis" "$rows" "$width" knn "$BIN" impute --spec "$DIR/impute.yaml" --unsafe-seed 1 --format json ;;
    marginals)
      measure "$axis" "$rows" "$width" marginals "$BENCH" marginals --input "$f" --domain "$dom" --k 2 --engine exec ;;
  esac
}

printf 'axis\trows\tcolumns\ttask\twall_s\tcpu_user_s\tcpu_sys_s\tpeak_rss_mb\n'
for rows in $ROWS; do
  for task in $TASKS; do
    if [ "$task" = aim ] && [ "$rows" != "$AIM_ROWS" ]; then continue; fi
    run_task rows "$rows" 16 "$task"
  done
done
for width in $WIDTHS; do
  for task in $TASKS; do
    run_task columns "$WIDTH_ROWS" "$width" "$task"
  done
done
