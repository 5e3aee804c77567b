#!/usr/bin/env python3
"""The `dpflow serve` load test of issue #22, end to end on loopback.

Sets up a catalog over the bundled penguins and adult data, a ledger and a
users file in a temporary directory, starts server processes on one ledger,
drives them with `load.py` (N psycopg clients x M queries, extended
protocol), then checks the ledger's invariants:

- no overspend: the dataset's committed spend <= its total, every analyst's <= their grant;
- no lost charge: one committed charge per answered query, per analyst;
- every query answered or refused for budget (no other error).

  python3 benches/serve/run.py [--dpflow target/debug/dpflow] [--clients 50] [--queries 100]

Writes benches/results/serve/load.json (and prints it).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PW = "load-test-password"


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def start(dpflow, d, name):
    log = open(os.path.join(d, f"{name}.log"), "w")
    p = subprocess.Popen([dpflow, "serve", "--catalog", f"{d}/catalog.yaml", "--users", f"{d}/users.yaml",
                          "--listen", "127.0.0.1:0", "--audit", f"{d}/audit.jsonl"],
                         stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(600):
        text = open(os.path.join(d, f"{name}.log")).read()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
        if m:
            return p, int(m.group(1))
        time.sleep(0.05)
    p.kill()
    sys.exit(f"server {name} did not start: {text}")


def scenario(dpflow, label, table, sql, query_eps, total, grants, servers, clients, queries):
    with tempfile.TemporaryDirectory() as d:
        sd = os.path.join(ROOT, "sample_data")
        with open(f"{d}/catalog.yaml", "w") as f:
            f.write(f"ledger: {d}/ledger.sqlite\nquery_budget: {{epsilon: {query_eps}}}\ntables:\n"
                    f"  adult: {{location: {sd}/adult/adult.data, domain: {sd}/adult/adult.domain.yaml, format: csv}}\n"
                    f"  penguins: {{location: {sd}/penguins/penguins.csv, domain: {sd}/penguins/penguins.domain.yaml}}\n")
        with open(f"{d}/users.yaml", "w") as f:
            f.write("roles:\n  all: {tables: [adult, penguins]}\n")
        for ds in ["adult", "penguins"]:
            sh(dpflow, "budget", "init", "--ledger", f"{d}/ledger.sqlite", "--dataset", ds, "--epsilon", str(total))
        for who, eps in grants.items():
            sh(dpflow, "serve", "add-user", "--users", f"{d}/users.yaml", "--name", who, "--roles", "all", input=PW + "\n")
            sh(dpflow, "budget", "grant", "--ledger", f"{d}/ledger.sqlite", "--dataset", table, "--analyst", who,
               "--epsilon", str(eps))
        procs = [start(dpflow, d, f"s{i}") for i in range(servers)]
        try:
            out = subprocess.run([sys.executable, os.path.join(ROOT, "benches/serve/load.py"),
                                  "--ports", ",".join(str(p) for _, p in procs), "--users", ",".join(grants),
                                  "--password-env", "LOAD_PW", "--clients", str(clients), "--queries", str(queries),
                                  "--sql", sql], capture_output=True, text=True, env={**os.environ, "LOAD_PW": PW})
        finally:
            for p, _ in procs:
                p.terminate()
                p.wait()
        if out.returncode != 0:
            sys.exit(f"load.py failed: {out.stdout}\n{out.stderr}")
        r = json.loads(out.stdout)
        hist = json.loads(sh(dpflow, "budget", "history", "--ledger", f"{d}/ledger.sqlite", "--dataset", table,
                             "--format", "json").stdout)
        status = json.loads(sh(dpflow, "budget", "show", "--ledger", f"{d}/ledger.sqlite", "--dataset", table,
                               "--format", "json").stdout)[0]
        analysts = {a["analyst"]: a for a in json.loads(sh(dpflow, "budget", "analysts", "--ledger",
                                                            f"{d}/ledger.sqlite", "--format", "json").stdout)}
        answered = r["outcomes"].get("answered", 0)
        checks = {
            "every_query_answered_or_refused_for_budget":
                sum(r["outcomes"].values()) == clients * queries
                and set(r["outcomes"]) <= {"answered", "PD100", "PD101"},
            "no_overspend_dataset": status["spent"] <= total * (1 + 1e-9),
            "no_overspend_analysts": all(analysts[w]["spent"] <= g * (1 + 1e-9) for w, g in grants.items()),
            "one_committed_charge_per_answer": len(hist) == answered
                and all(c["status"] == "committed" for c in hist),
            "charges_match_per_analyst": all(
                sum(1 for c in hist if c["analyst"] == w) == r["answered_per_user"][w] for w in grants),
        }
        return {"scenario": label, "sql": sql, "query_epsilon": query_eps, "dataset_total": total,
                "grants": grants, **r, "dataset_spent": status["spent"], "checks": checks}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpflow", default=os.path.join(ROOT, "target/debug/dpflow"))
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--out", default=os.path.join(ROOT, "benches/results/serve/load.json"))
    a = ap.parse_args()
    n = a.clients * a.queries
    users = {f"analyst{i}": None for i in range(5)}
    results = [
        # Throughput: every query fits.
        scenario(a.dpflow, "one server, budgets that fit every query", "penguins",
                 "SELECT species, dp_count(*) FROM penguins GROUP BY species", 0.001, n * 0.001 * 2,
                 {u: n * 0.001 for u in users}, 1, a.clients, a.queries),
        scenario(a.dpflow, "two servers on one ledger, budgets that fit every query", "penguins",
                 "SELECT species, dp_count(*) FROM penguins GROUP BY species", 0.001, n * 0.001 * 2,
                 {u: n * 0.001 for u in users}, 2, a.clients, a.queries),
        # Exhaustion: grants sum past the dataset's total; both caps bind mid-run.
        scenario(a.dpflow, "two servers on one ledger, grants and total exhausted mid-run", "penguins",
                 "SELECT species, dp_count(*) FROM penguins GROUP BY species", 0.01, n * 0.01 * 0.3,
                 {u: n * 0.01 * 0.08 for u in users}, 2, a.clients, a.queries),
        scenario(a.dpflow, "two servers on one ledger, analysts' grants exhausted before the total", "penguins",
                 "SELECT species, dp_count(*) FROM penguins GROUP BY species", 0.01, n * 0.01,
                 {u: n * 0.01 * 0.05 for u in users}, 2, a.clients, a.queries),
        scenario(a.dpflow, "two servers on one ledger, adult (32,561 rows), exhausted mid-run", "adult",
                 "SELECT sex, dp_count(*), dp_avg(age, 17, 90) FROM adult GROUP BY sex", 0.01, n * 0.01 * 0.3,
                 {u: n * 0.01 * 0.08 for u in users}, 2, a.clients, a.queries),
    ]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"clients": a.clients, "queries_per_client": a.queries, "dpflow": a.dpflow,
                   "machine": "2 cores, loopback, debug build (dependencies at opt-level 1)",
                   "results": results}, f, indent=1)
    for r in results:
        print(f"{r['scenario']}: {r['outcomes']} in {r['wall_s']} s, {r['throughput_qps']} q/s, "
              f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, checks {'ok' if all(r['checks'].values()) else r['checks']}")
    sys.exit(0 if all(all(r["checks"].values()) for r in results) else 1)


if __name__ == "__main__":
    main()
