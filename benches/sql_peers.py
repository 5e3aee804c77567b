#!/usr/bin/env python3
"""DP SQL side by side (issue #7): count, sum and mean by group on Adult through
dpflow and smartnoise-sql at the same ε, RMSE over --runs runs against the exact
answers, and per-query latency.

    benches/sql_peers.py --bin target/release/dpflow --peers-python .venv-peers/bin/python [--runs 100]

Both systems get the public group keys (smartnoise: censor_dims off) and the
same bounds; one unit = one row. dpflow runs each query as a separate
`dpflow sql -e` process (latency includes process start and reading the CSV);
smartnoise-sql runs in one Python process (latency excludes Python start-up and
the pandas CSV read, which are paid once), so the comparison favours the peer.
Writes results.md in --out (default benches/results/sql).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADULT = os.path.join(ROOT, "sample_data", "adult", "adult.data")
DOMAIN = os.path.join(ROOT, "sample_data", "adult", "adult.domain.yaml")
COLS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation", "relationship",
        "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "income"]

# (name, dpflow SQL, smartnoise SQL); ε = 1 per query in both.
QUERIES = [
    ("count by sex", 'SELECT sex, dp_count(*) AS v FROM adult GROUP BY sex',
     "SELECT sex, COUNT(*) AS v FROM adult.adult GROUP BY sex"),
    ("sum hours by sex", 'SELECT sex, dp_sum("hours-per-week", 1, 99) AS v FROM adult GROUP BY sex',
     "SELECT sex, SUM(hours) AS v FROM adult.adult GROUP BY sex"),
    ("mean age by sex", 'SELECT sex, dp_avg(age, 17, 90) AS v FROM adult GROUP BY sex',
     "SELECT sex, AVG(age) AS v FROM adult.adult GROUP BY sex"),
]

PEER = r'''
import json, sys, time
import pandas as pd
import snsql
from snsql import Privacy
cols, adult, runs, eps = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
queries = json.loads(sys.argv[5])
df = pd.read_csv(adult, names=cols, skipinitialspace=True, na_values=["?"])
df = df.rename(columns={"hours-per-week": "hours"})[["sex", "age", "hours"]]
meta = {"": {"adult": {"adult": {
    "row_privacy": True, "max_ids": 1, "censor_dims": False, "rows": len(df),
    "sex": {"type": "string"},
    "age": {"type": "int", "lower": 17, "upper": 90, "nullable": False},
    "hours": {"type": "int", "lower": 1, "upper": 99, "nullable": False},
}}}}
out = {}
for name, q in queries:
    reader = snsql.from_df(df, privacy=Privacy(epsilon=eps, delta=1e-9), metadata=meta)
    vals, secs = [], []
    for _ in range(runs):
        t = time.time()
        r = reader.execute(q)
        secs.append(time.time() - t)
        vals.append({row[0]: row[1] for row in r[1:]})
    out[name] = {"values": vals, "seconds": secs}
print(json.dumps(out, default=float))
'''


def exact():
    import csv
    rows = [r for r in csv.reader(open(ADULT), skipinitialspace=True) if len(r) == len(COLS)]
    out = {"count by sex": {}, "sum hours by sex": {}, "mean age by sex": {}}
    ages = {}
    for r in rows:
        s = r[9]
        out["count by sex"][s] = out["count by sex"].get(s, 0) + 1
        out["sum hours by sex"][s] = out["sum hours by sex"].get(s, 0) + min(max(int(r[12]), 1), 99)
        ages.setdefault(s, []).append(min(max(int(r[0]), 17), 90))
    out["mean age by sex"] = {s: sum(v) / len(v) for s, v in ages.items()}
    return out


def rmse(values, truth):
    errs = [(run.get(k, float("nan")) - t) ** 2 for run in values for k, t in truth.items()]
    errs = [e for e in errs if e == e]
    return (sum(errs) / len(errs)) ** 0.5 if errs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "dpflow"))
    ap.add_argument("--peers-python", default="python3")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "results", "sql"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    truth = exact()
    with tempfile.TemporaryDirectory() as d:
        cat = os.path.join(d, "catalog.yaml")
        # An evaluation ledger with a budget large enough for every run (each query is charged to it).
        open(cat, "w").write("ledger: ledger.sqlite\ncreate_ledger_if_missing:\n  adult: {epsilon: 1.0e6}\n"
                             f"tables:\n  adult:\n    location: {ADULT}\n    domain: {DOMAIN}\n    format: csv\n"
                             "    privacy_unit: row\n")
        ours = {}
        for name, q, _ in QUERIES:
            vals, secs = [], []
            for _ in range(a.runs):
                t = time.time()
                r = subprocess.run([a.bin, "sql", "--catalog", cat, "-e", q, "--epsilon", str(a.epsilon), "--format",
                                    "json"], capture_output=True, text=True)
                secs.append(time.time() - t)
                if r.returncode != 0:
                    sys.exit(r.stderr)
                doc = json.loads(r.stdout)
                vals.append({row["sex"]: float(row["v"]) for row in doc["rows"]})
            ours[name] = {"values": vals, "seconds": secs}
            print(f"dpflow {name}: RMSE {rmse(vals, truth[name]):.4g}", flush=True)
    r = subprocess.run([a.peers_python, "-c", PEER, json.dumps(COLS), ADULT, str(a.runs), str(a.epsilon),
                        json.dumps([(n, p) for n, _, p in QUERIES])], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr[-3000:])
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    lines = [f"Adult (32,561 rows), ε = {a.epsilon} per query, {a.runs} runs; RMSE over runs and the two groups.\n",
             "| query | exact (Female / Male) | dpflow RMSE | smartnoise-sql RMSE | dpflow median latency (process) "
             "| smartnoise-sql median latency (in-process) |", "|---|---|---|---|---|---|"]
    for name, _, _ in QUERIES:
        t = truth[name]
        lines.append(f"| {name} | {t['Female']:.6g} / {t['Male']:.6g} | {rmse(ours[name]['values'], t):.4g} | "
                     f"{rmse(peer[name]['values'], t):.4g} | {statistics.median(ours[name]['seconds']) * 1000:.0f} ms | "
                     f"{statistics.median(peer[name]['seconds']) * 1000:.0f} ms |")
    open(os.path.join(a.out, "results.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
