#!/usr/bin/env python3
"""Side-by-side synthesizer comparison on Adult (issue #10).

dpflow AIM / MST against private-pgm's own mechanisms (mechanisms/mst.py,
mechanisms/aim.py at commit 4d2b3c5) and smartnoise-synth (../shared/peers/
run_peer.py), on ../shared/data/adult-coded at the given ε, δ = 1e-9, several
seeds. Every synthetic CSV is measured by ../shared/peers/workload_error.py
(all-1/2/3-way TVD), so all systems are measured the same way.

Runs are sequential (one at a time on the machine) so wall times compare.

    benches/peers_synth.py --bin target/release/dpflow --seeds 0,1,2 \
        --ppgm /path/to/private-pgm --ppgm-python /path/to/venv-ppgm/bin/python \
        --peers-python /path/to/venv-peers/bin/python [--only dpflow]

Writes results.csv and summary.md in --out (default benches/results/peers).
private-pgm has no seed argument: its runs are independent draws.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")
DATA = os.path.join(SHARED, "data", "adult-coded")
PEERS = os.path.join(SHARED, "peers")


def run(cmd, env=None, cwd=None, timeout=None):
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-3000:]}")
    return r.stdout, time.time() - t


def peak_rss_run(cmd, env=None, cwd=None, timeout=None):
    """Runs under /usr/bin/time; returns (stdout, seconds, peak RSS MB)."""
    t = time.time()
    r = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M"] + cmd, capture_output=True, text=True, env=env,
                       cwd=cwd, timeout=timeout)
    secs = time.time() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-3000:]}")
    rss = [line for line in r.stderr.splitlines() if line.startswith("MAXRSS")]
    return r.stdout, secs, (int(rss[-1].split()[1]) / 1024 if rss else float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "dpflow"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--ppgm", help="a private-pgm checkout (mechanisms/, src/)")
    ap.add_argument("--ppgm-python", default="python3")
    ap.add_argument("--peers-python", default="python3", help="a Python with smartnoise-synth and pandas")
    ap.add_argument("--only", default="", help="comma list of systems to run (dpflow,private-pgm,smartnoise)")
    ap.add_argument("--ppgm-aim", action="store_true", help="also run private-pgm AIM (slow)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "results", "peers"))
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "work"), exist_ok=True)
    real = os.path.join(DATA, "adult.csv")
    domain = os.path.join(DATA, "adult-domain.json")
    eps = a.epsilon
    only = set(filter(None, a.only.split(",")))
    want = lambda s: not only or s in only  # noqa: E731
    rows = []

    def measure(system, mech, seed, synth, secs, rss):
        out, _ = run([a.peers_python, os.path.join(PEERS, "workload_error.py"), "--real", real, "--synth", synth,
                      "--domain", domain, "--workload", "all-1way", "all-2way", "all-3way"])
        err = json.loads(out.strip().splitlines()[-1])
        row = {"system": system, "mechanism": mech, "seed": seed, "epsilon": eps, "seconds": round(secs, 2),
               "peak_rss_mb": round(rss, 1), "tvd1": err["all-1way"]["error"],
               "tvd2": err["all-2way"]["error"], "tvd3": err["all-3way"]["error"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
        os.remove(synth)

    for seed in [int(s) for s in a.seeds.split(",")]:
        w = os.path.join(a.out, "work")
        if want("dpflow"):
            for mech, workload in [("mst", "all-2way"), ("aim", "all-3way")]:
                synth = os.path.join(w, f"dpflow-{mech}-{seed}.csv")
                _, secs, rss = peak_rss_run([a.bin, "synth", "--input", real, "--domain", domain, "--mechanism", mech,
                                             "--epsilon", str(eps), "--delta", "1e-9", "--workload", workload,
                                             "--out", synth, "--unsafe-seed", str(seed)])
                measure("dpflow", f"{mech.upper()} ({workload})", seed, synth, secs, rss)
        if want("private-pgm") and a.ppgm:
            env = dict(os.environ, PYTHONPATH=os.path.join(a.ppgm, "src"))
            mechs = [("mst", [])] + ([("aim", ["--degree", "3"])] if a.ppgm_aim else [])
            for mech, extra in mechs:
                synth = os.path.join(w, f"ppgm-{mech}-{seed}.csv")
                _, secs, rss = peak_rss_run([a.ppgm_python, os.path.join(a.ppgm, "mechanisms", f"{mech}.py"),
                                             "--dataset", real, "--domain", domain, "--epsilon", str(eps),
                                             "--delta", "1e-9", "--save", synth] + extra, env=env,
                                            cwd=os.path.join(a.ppgm, "mechanisms"))
                measure("private-pgm", mech.upper() + (" (all-3way)" if mech == "aim" else ""), seed, synth, secs,
                        rss)
        if want("smartnoise"):
            synth = os.path.join(w, f"smartnoise-mst-{seed}.csv")
            _, secs, rss = peak_rss_run([a.peers_python, os.path.join(PEERS, "run_peer.py"), "--mech", "mst", "--data",
                                         real, "--domain", domain, "--epsilon", str(eps), "--delta", "1e-9", "--seed",
                                         str(seed), "--out", synth])
            measure("smartnoise-synth", "MST", seed, synth, secs, rss)

    path = os.path.join(a.out, "results.csv")
    old = []
    if os.path.exists(path) and only:
        # Keep the other systems' rows from an earlier run.
        old = [r for r in csv.DictReader(open(path)) if r["system"] not in {x["system"] for x in rows}]
    allrows = old + rows
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(old[0]))
        wr.writeheader()
        wr.writerows(allrows)
    groups = {}
    for r in allrows:
        groups.setdefault((r["system"], r["mechanism"]), []).append(r)
    fmt = lambda xs: f"{statistics.mean(xs):.4f} ± {statistics.pstdev(xs):.4f}"  # noqa: E731
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(f"Adult (adult-coded, 48,842 rows), ε = {eps}, δ = 1e-9; mean ± sd over runs; TVD from "
                "../shared/peers/workload_error.py.\n\n")
        f.write("| system | mechanism | runs | seconds | peak RSS MB | 1-way | 2-way | 3-way |\n|---|---|---|---|---|---|---|---|\n")
        for (s, m), rs in groups.items():
            g = lambda k: [float(r[k]) for r in rs]  # noqa: E731
            f.write(f"| {s} | {m} | {len(rs)} | {statistics.mean(g('seconds')):.1f} | "
                    f"{statistics.mean(g('peak_rss_mb')):.0f} | {fmt(g('tvd1'))} | {fmt(g('tvd2'))} | "
                    f"{fmt(g('tvd3'))} |\n")
    print(open(os.path.join(a.out, "summary.md")).read())


if __name__ == "__main__":
    main()
