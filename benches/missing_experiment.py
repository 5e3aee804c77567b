#!/usr/bin/env python3
"""000 §6.1 on Adult: complete-row vs imputation-first vs adaptive recourse.

Ground truth: ../shared/data/adult-coded (48,842 rows, 15 attributes, no nulls).
For each missingness setting (MCAR 10/20/30%, MAR 20%, MNAR 20%) and run, inject
nulls with `dpflow missing inject`, synthesize with every method at each ε, and
measure 1-/2-way TVD against the complete ground truth and ML efficacy
(train on synthetic, test on the ground truth; F1 of income>50K) with
`dpflow eval`. Also reproduces 000 Table 2 (PrivBayesE at ε = 1, MCAR 10-50%):
the amplified factor from Alg 4 over the measured marginals.

Usage: benches/missing_experiment.py [--bin target/release/dpflow] [--runs 3]
       [--eps 1,3] [--out benches/results/missing] [--quick]
Writes results.csv, summary.md and table2.md in --out. Seeds are fixed
(--unsafe-seed): these are evaluation runs, not private releases.
"""
import argparse
import concurrent.futures as cf
import csv
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "..", "shared", "data", "adult-coded")

# (name, mechanism, --missing)
METHODS = [
    ("PrivBayes (complete-row)", "privbayes", "complete-row"),
    ("PrivBayesE (adaptive)", "privbayes", "adaptive"),
    ("PrivBayes (impute-first:mode)", "privbayes", "impute-first:mode"),
    ("AIM (complete-row)", "aim", "complete-row"),
    ("AIME (adaptive)", "aim", "adaptive"),
    ("AIM (impute-first:model)", "aim", "impute-first:model"),
    ("Kamino (complete-row)", "kamino", "complete-row"),
    ("KaminoI (adaptive)", "kaminoi", "adaptive"),
    ("DP-GAN (complete-row)", "dp-gan", "complete-row"),
    ("DP-MisGAN (adaptive)", "dp-misgan", "adaptive"),
]
SETTINGS = [("MCAR", "mcar", 0.1), ("MCAR", "mcar", 0.2), ("MCAR", "mcar", 0.3), ("MAR", "mar", 0.2), ("MNAR", "mnar", 0.2)]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-3000:]}")
    return r.stdout


def one(args, work, setting, seed, method, eps):
    label, mech, missing = method
    kind, mname, rate = setting
    tag = f"{mname}{int(rate*100)}-s{seed}"
    inp = os.path.join(work, f"{tag}.parquet")
    dom = os.path.join(work, f"{tag}.domain.yaml")
    out = os.path.join(work, f"{tag}-{mech}-{missing.replace(':', '_')}-e{eps}.parquet")
    cmd = [args.bin, "synth", "--input", inp, "--domain", dom, "--mechanism", mech, "--epsilon", str(eps),
           "--delta", "1e-9", "--missing", missing, "--workload", "all-2way", "--out", out,
           "--unsafe-seed", str(1000 * seed + int(eps * 10)), "--iters", str(args.iters)]
    if mech.startswith("kamino"):
        cmd += args.kamino_args.split()
    if mech.startswith("dp-"):
        cmd += args.gan_args.split()
    if mname == "mcar":
        cmd += ["--missingness", "mcar", "--missing-rates", str(rate)]
    t = time.time()
    run(cmd)
    secs = time.time() - t
    rec = json.load(open(out + ".record.json"))
    ev = json.loads(run([args.bin, "eval", "--real", os.path.join(DATA, "adult.csv"), "--synth", out, "--domain",
                         os.path.join(DATA, "adult-domain.json"), "--workload", "all-2way", "--ml-target",
                         "income>50K", "--format", "json"]))
    amp = rec.get("amplification") or {}
    os.remove(out)
    return {
        "setting": f"{kind} {int(rate*100)}%", "seed": seed, "method": label, "epsilon": eps,
        "tvd1": ev["tvd_1way"], "tvd2": ev["tvd_2way"], "f1_lr": ev["ml"]["logistic_regression_f1"],
        "f1_dt": ev["ml"]["decision_tree_f1"], "seconds": round(secs, 2),
        "eps_bar": amp.get("epsilon", ""), "factor_marginals": amp.get("marginal_linear_factor", ""),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "dpflow"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--eps", default="1,3")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "results", "missing"))
    ap.add_argument("--quick", action="store_true", help="one run, ε = 1, MCAR 20%% only")
    ap.add_argument("--slow-subset", action="store_true",
                    help="AIM/AIME at ε > 1: one run on MCAR 20%% and MAR 20%% only (time-boxed runs)")
    ap.add_argument("--resume", action="store_true", help="keep results.csv rows and run only the missing jobs")
    ap.add_argument("--methods", default="", help="comma-separated mechanisms to run (default: all), e.g. kamino,kaminoi")
    ap.add_argument("--settings", default="", help="comma-separated settings to run (default: all), e.g. mcar20,mar20,mnar20")
    ap.add_argument("--kamino-args", default="", help="extra flags for kamino/kaminoi, e.g. '--kamino-epochs 3'")
    ap.add_argument("--gan-args", default="", help="extra flags for dp-gan/dp-misgan, e.g. '--gan-epochs 3'")
    ap.add_argument("--no-table2", action="store_true", help="skip 000 Table 2 (PrivBayesE amplification)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    eps_list = [float(e) for e in args.eps.split(",")]
    settings = SETTINGS
    if args.quick:
        args.runs, eps_list, settings = 1, [1.0], [SETTINGS[1]]
    if args.settings:
        keep = args.settings.split(",")
        settings = [st for st in settings if f"{st[1]}{int(st[2] * 100)}" in keep]
    methods = [m for m in METHODS if not args.methods or m[1] in args.methods.split(",")]

    # Inject once per (setting, seed).
    for (kind, mname, rate) in settings:
        for seed in range(args.runs):
            tag = f"{mname}{int(rate*100)}-s{seed}"
            run([args.bin, "missing", "inject", "--input", os.path.join(DATA, "adult.csv"), "--domain",
                 os.path.join(DATA, "adult-domain.json"), "--mechanism", mname, "--rate", str(rate),
                 "--unsafe-seed", str(seed), "--out", os.path.join(work, f"{tag}.parquet"),
                 "--domain-out", os.path.join(work, f"{tag}.domain.yaml")])

    if not args.no_table2:
        table2(args, work)

    # Smallest ε first, so an interrupted run still has complete tables for it. Rows are appended to
    # results.csv as they finish; --resume skips the jobs already there.
    jobs = [(s, seed, m, e) for e in eps_list for s in settings for seed in range(args.runs) for m in methods]
    if args.slow_subset:
        # AIM-family runs at ε > 1 take minutes each on 2 cores: only seed 0 on MCAR 20% and MAR 20%.
        jobs = [j for j in jobs if not (j[3] > 1 and j[2][1] == "aim" and (j[1] != 0 or j[0] not in
                                                                            (SETTINGS[1], SETTINGS[3])))]
    fields = ["setting", "seed", "method", "epsilon", "tvd1", "tvd2", "f1_lr", "f1_dt", "seconds", "eps_bar",
              "factor_marginals"]
    path = os.path.join(args.out, "results.csv")
    rows = []
    if args.resume and os.path.exists(path):
        for r in csv.DictReader(open(path)):
            for k in ["seed"]:
                r[k] = int(r[k])
            for k in ["epsilon", "tvd1", "tvd2", "f1_lr", "f1_dt", "seconds"]:
                r[k] = float(r[k])
            rows.append(r)
        done = {(r["setting"], r["seed"], r["method"], r["epsilon"]) for r in rows}
        jobs = [j for j in jobs if (f"{j[0][0]} {int(j[0][2]*100)}%", j[1], j[2][0], j[3]) not in done]
    else:
        with open(path, "w", newline="") as fh:
            csv.DictWriter(fh, fieldnames=fields).writeheader()
    with cf.ThreadPoolExecutor(args.jobs) as ex:
        futs = {ex.submit(one, args, work, *j): j for j in jobs}
        for i, f in enumerate(cf.as_completed(futs)):
            try:
                r = f.result()
                rows.append(r)
                with open(path, "a", newline="") as fh:
                    csv.DictWriter(fh, fieldnames=fields).writerow(r)
                print(f"[{i+1}/{len(jobs)}] {r['setting']} {r['method']} ε={r['epsilon']} seed={r['seed']}: "
                      f"2-way {r['tvd2']:.4f} ({r['seconds']}s)", flush=True)
            except Exception as e:  # keep going; report the failure
                print(f"[{i+1}/{len(jobs)}] FAILED {futs[f]}: {e}", file=sys.stderr, flush=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(sorted(rows, key=lambda r: (r["setting"], r["epsilon"], r["method"], r["seed"])))

    # Summary: mean ± sd over runs.
    def ms(v):
        return f"{statistics.mean(v):.4f} ± {statistics.stdev(v):.4f}" if len(v) > 1 else f"{v[0]:.4f}"
    lines = ["| setting | ε | method | 1-way TVD | 2-way TVD | F1 LR | F1 DT | s/run |", "|---|---|---|---|---|---|---|---|"]
    order = [f"{k} {int(r * 100)}%" for k, _, r in SETTINGS]
    names = [m[0] for m in METHODS]
    keys = sorted({(r["setting"], r["epsilon"], r["method"]) for r in rows},
                  key=lambda k: (order.index(k[0]), k[1], names.index(k[2])))
    for k in keys:
        g = [r for r in rows if (r["setting"], r["epsilon"], r["method"]) == k]
        lines.append(f"| {k[0]} | {k[1]:g} | {k[2]} | {ms([r['tvd1'] for r in g])} | {ms([r['tvd2'] for r in g])} | "
                     f"{ms([r['f1_lr'] for r in g])} | {ms([r['f1_dt'] for r in g])} | {statistics.mean([r['seconds'] for r in g]):.1f} |")
    open(os.path.join(args.out, "summary.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def table2(args, work):
    """000 Table 2: PrivBayesE at ε = 1 on MCAR 10-50%."""
    paper = {10: 0.88, 20: 0.77, 30: 0.65, 40: 0.47, 50: 0.44}
    t2 = ["| MCAR | paper factor | dpflow factor (marginals, Alg 4) | dpflow ε̄ (whole release, Thm 5.3) |", "|---|---|---|---|"]
    for pct in sorted(paper):
        rate = pct / 100
        tag = f"t2-{pct}"
        inp = os.path.join(work, f"{tag}.parquet")
        dom = os.path.join(work, f"{tag}.domain.yaml")
        run([args.bin, "missing", "inject", "--input", os.path.join(DATA, "adult.csv"), "--domain",
             os.path.join(DATA, "adult-domain.json"), "--mechanism", "mcar", "--rate", str(rate), "--unsafe-seed", "0",
             "--out", inp, "--domain-out", dom])
        out = os.path.join(work, f"{tag}-pbe.parquet")
        run([args.bin, "synth", "--input", inp, "--domain", dom, "--mechanism", "privbayes", "--epsilon", "1",
             "--missing", "adaptive", "--missingness", "mcar", "--missing-rates", str(rate), "--out", out,
             "--unsafe-seed", "0"])
        amp = json.load(open(out + ".record.json"))["amplification"]
        t2.append(f"| {pct}% | {paper[pct]:.2f} | {amp['marginal_linear_factor']:.2f} | {amp['epsilon']:.3f} |")
    open(os.path.join(args.out, "table2.md"), "w").write("\n".join(t2) + "\n")
    print("\n".join(t2), flush=True)


if __name__ == "__main__":
    main()
