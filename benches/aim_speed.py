#!/usr/bin/env python3
"""AIM wall time, CPU time, peak memory and workload error on Adult (issue #19).

Runs `dpflow synth --mechanism aim` on ../shared/data/adult-coded at ε = 1,
δ = 1e-9, all-3way workload, one seed after another, for one or more dpflow
binaries (e.g. a build of the previous commit next to the current one, so
both are measured in one run on one machine). Every synthetic CSV is scored by
../shared/peers/workload_error.py, as the peers are.

    benches/aim_speed.py --bin before=/tmp/dpflow-old --bin after=target/release/dpflow \
        --seeds 0,1,2,3,4,5 --python /path/to/python-with-pandas

private-pgm's own `mechanisms/aim.py` (commit 4d2b3c5) takes hours, so it is
run by hand, detached, and its `/usr/bin/time -v` log is read with
--ppgm-time (see benches/results/aim/README.md for the command).

Writes runs.csv and summary.md in --out (default benches/results/aim).
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")
DATA = os.path.join(SHARED, "data", "adult-coded")
PEERS = os.path.join(SHARED, "peers")


def timed(cmd):
    """Runs under /usr/bin/time; returns (wall s, CPU s, peak RSS MB)."""
    r = subprocess.run(["/usr/bin/time", "-f", "TIMES %e %U %S %M"] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-3000:]}")
    line = [x for x in r.stderr.splitlines() if x.startswith("TIMES")][-1].split()
    return float(line[1]), float(line[2]) + float(line[3]), int(line[4]) / 1024


def errors(python, synth):
    real = os.path.join(DATA, "adult.csv")
    out = subprocess.run([python, os.path.join(PEERS, "workload_error.py"), "--real", real, "--synth", synth,
                          "--domain", os.path.join(DATA, "adult-domain.json"), "--workload", "all-1way",
                          "all-2way", "all-3way"], capture_output=True, text=True, check=True).stdout
    e = json.loads(out.strip().splitlines()[-1])
    return e["all-1way"]["error"], e["all-2way"]["error"], e["all-3way"]["error"]


def ppgm_times(path):
    """Wall and CPU seconds and peak RSS MB from a `/usr/bin/time -v` log."""
    text = open(path).read()
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", text).group(1))
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", text).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text).group(1)
    secs = 0.0
    for part in wall.split(":"):
        secs = secs * 60 + float(part)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) / 1024
    return secs, user + system, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="label=path of a dpflow binary (repeatable)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--python", default="python3", help="a Python with pandas and numpy")
    ap.add_argument("--ppgm-time", help="/usr/bin/time -v log of private-pgm's aim.py")
    ap.add_argument("--ppgm-synth", help="its synthetic CSV")
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "results", "aim"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for seed in [int(s) for s in a.seeds.split(",")]:
            for spec in a.bin:
                label, path = spec.split("=", 1)
                synth = os.path.join(work, f"{label}-{seed}.csv")
                wall, cpu, rss = timed([path, "synth", "--input", os.path.join(DATA, "adult.csv"), "--domain",
                                        os.path.join(DATA, "adult-domain.json"), "--mechanism", "aim",
                                        "--epsilon", "1", "--delta", "1e-9", "--workload", "all-3way", "--out",
                                        synth, "--unsafe-seed", str(seed)])
                e1, e2, e3 = errors(a.python, synth)
                row = {"system": f"dpflow {label}", "seed": seed, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                       "peak_rss_mb": round(rss, 1), "tvd1": e1, "tvd2": e2, "tvd3": e3}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if a.ppgm_time:
        wall, cpu, rss = ppgm_times(a.ppgm_time)
        e1, e2, e3 = errors(a.python, a.ppgm_synth) if a.ppgm_synth else (float("nan"),) * 3
        rows.append({"system": "private-pgm aim.py", "seed": "", "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                     "peak_rss_mb": round(rss, 1), "tvd1": e1, "tvd2": e2, "tvd3": e3})
    with open(os.path.join(a.out, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    groups = {}
    for r in rows:
        groups.setdefault(r["system"], []).append(r)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("AIM on adult-coded (48,842 rows, 15 attributes), ε = 1, δ = 1e-9, all-3way, 80 MB model cap; "
                "2 cores. TVD from ../shared/peers/workload_error.py.\n\n")
        f.write("| system | runs | median wall s | median CPU s | peak RSS MB | 1-way | 2-way | 3-way (mean ± sd) |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        for s, rs in groups.items():
            g = lambda k: [float(r[k]) for r in rs]  # noqa: E731
            sd = statistics.pstdev(g("tvd3")) if len(rs) > 1 else 0.0
            f.write(f"| {s} | {len(rs)} | {statistics.median(g('wall_s')):.1f} | {statistics.median(g('cpu_s')):.1f} | "
                    f"{max(g('peak_rss_mb')):.0f} | {statistics.mean(g('tvd1')):.4f} | {statistics.mean(g('tvd2')):.4f} | "
                    f"{statistics.mean(g('tvd3')):.4f} ± {sd:.4f} |\n")


if __name__ == "__main__":
    main()
