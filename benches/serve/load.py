#!/usr/bin/env python3
"""Load test of `dpflow serve`: N concurrent psycopg clients, each sending M
DP queries over the extended protocol, spread over one or more servers that
share one ledger. Prints one JSON object: counts by outcome (answered,
refused by SQLSTATE), throughput and latency percentiles. The caller checks
the ledger's invariants (no overspend, no lost charge).

  python3 benches/serve/load.py --ports 5433,5434 --users alice,bob \
      --password-env LOAD_PW --clients 50 --queries 100 \
      --sql "SELECT species, dp_count(*) FROM penguins GROUP BY species"
"""
import argparse
import json
import os
import sys
import threading
import time

import psycopg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", required=True, help="comma-separated server ports on 127.0.0.1")
    ap.add_argument("--users", required=True, help="comma-separated analysts (client i logs in as users[i % n])")
    ap.add_argument("--password-env", required=True, help="environment variable holding every user's password")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--sql", required=True)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is declared stuck")
    a = ap.parse_args()
    ports = [int(p) for p in a.ports.split(",")]
    users = a.users.split(",")
    password = os.environ[a.password_env]
    lock = threading.Lock()
    outcomes = {}
    per_user = {u: 0 for u in users}
    latencies = []
    failures = []
    messages = {}

    def client(i):
        user = users[i % len(users)]
        port = ports[i % len(ports)]
        try:
            conn = psycopg.connect(
                host="127.0.0.1", port=port, user=user, password=password, dbname="dpflow",
                sslmode="disable", autocommit=True, connect_timeout=30,
            )
        except Exception as e:  # noqa: BLE001 - reported, counted
            with lock:
                failures.append(f"connect: {e}")
            return
        with conn:
            for _ in range(a.queries):
                t = time.perf_counter()
                try:
                    conn.execute(a.sql).fetchall()
                    key = "answered"
                    with lock:
                        per_user[user] += 1
                except psycopg.Error as e:
                    key = e.sqlstate or "no-sqlstate"
                    if key not in ("PD100", "PD101"):
                        with lock:
                            messages.setdefault(key, str(e).strip()[:300])
                dt = time.perf_counter() - t
                with lock:
                    outcomes[key] = outcomes.get(key, 0) + 1
                    latencies.append(dt)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, a.timeout - (time.perf_counter() - start)))
    wall = time.perf_counter() - start
    stuck = sum(t.is_alive() for t in threads)
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else None

    print(json.dumps({
        "clients": a.clients, "queries_per_client": a.queries, "servers": len(ports),
        "outcomes": outcomes, "answered_per_user": per_user, "failures": failures[:5], "unexpected_errors": messages,
        "stuck_clients": stuck, "wall_s": round(wall, 3),
        "throughput_qps": round(len(latencies) / wall, 1) if wall > 0 else None,
        "p50_ms": pct(0.50), "p99_ms": pct(0.99),
    }))
    sys.exit(1 if failures or stuck else 0)


if __name__ == "__main__":
    main()
