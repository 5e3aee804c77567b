#!/usr/bin/env python3
"""Plots 002 Figs. 2-4 style panels from `dpflow-bench dips-study` CSV tables.

usage: dips_plot.py study1.csv|study2.csv|study3.csv|study4.csv OUT_DIR

One PNG per (estimand, π or σ²): rows are bias, RMSE, 95% coverage and CI
width, columns are n, one line per method, x is ln ε. Study 2's σ² metrics
are already divided by the true σ² (relative bias, scaled RMSE and width).
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "LAP": ("tab:blue", "-"),
    "PERT": ("tab:blue", "-"),
    "MD": ("tab:orange", "-"),
    "SMOOTH": ("tab:orange", "-"),
    "BB-MR": ("tab:green", "-"),
    "MODIPS": ("tab:red", "-"),
    "MODIPS(L=1)": ("tab:red", "-"),
    "MODIPS(L=10)": ("tab:purple", "-"),
    "MODIPS-wrong": ("tab:orange", "-"),
    "NP-DIPS": ("tab:blue", "-"),
    "MS": ("black", "--"),
    "ORI": ("grey", ":"),
}
METRICS = [("bias", "bias"), ("rmse", "RMSE"), ("coverage", "95% CP"), ("width", "CI width")]


def study3(rows, out, panels=None, suptitle="002 study 3 (GLOM, n = 1000): metrics averaged over the terms",
           name="study3", log_bias=False):
    """Fig. 5 style: Π (mean over its 6 marginals) and μ₁ (mean over the 24 cells)."""
    panels = panels or [
        ("Π (6 marginals)", lambda e: e.startswith("P(")),
        ("μ₁ (24 cell means)", lambda e: e.startswith("mu1")),
    ]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(len(METRICS), len(panels), figsize=(9, 2.6 * len(METRICS)), squeeze=False)
    for j, (title, pick) in enumerate(panels):
        for i, (key, label) in enumerate(METRICS):
            ax = axes[i][j]
            for m in methods:
                by_eps = defaultdict(list)
                for r in rows:
                    if r["method"] == m and pick(r["estimand"]) and int(r["repeats"]) > 0:
                        v = float(r[key])
                        by_eps[float(r["log_epsilon"])].append(abs(v) if key == "bias" else v)
                pts = sorted((e, sum(v) / len(v)) for e, v in by_eps.items())
                color, ls = STYLE.get(m, ("tab:blue", "-"))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=color, label=m, lw=1.4)
            if key == "coverage":
                ax.axhline(0.95, color="grey", lw=0.6)
                ax.set_ylim(0, 1.02)
            if key in ("rmse", "width") or (key == "bias" and log_bias):
                ax.set_yscale("log")
            if i == 0:
                ax.set_title(title)
            if j == 0:
                ax.set_ylabel("mean |bias|" if key == "bias" else label)
            if i == len(METRICS) - 1:
                ax.set_xlabel("ln ε")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(suptitle)
    fig.tight_layout()
    fig.savefig(f"{out}/{name}.png", dpi=80)
    plt.close(fig)


def study4(rows, out):
    """Figs. 6-7 style: β₂ and β₃ (002's figures), and μ, Σ; each metric averaged over the
    panel's terms (|bias| for the bias), only (ε, method, term) cells with estimates."""
    panels = [
        ("μ₁, μ₂", lambda e: e.startswith("mu")),
        ("σ₁², σ₂², ρ", lambda e: e.startswith("sigma") or e == "rho"),
        ("β₂ (4 coefficients)", lambda e: e.startswith("beta2")),
        ("β₃ (5 coefficients)", lambda e: e.startswith("beta3")),
    ]
    title = "002 study 4 (SLOMAG, n = 1000): metrics averaged over the terms (log |bias|)"
    study3(rows, out, panels, title, "study4", log_bias=True)


def main(path, out):
    rows = list(csv.DictReader(open(path)))
    if rows and rows[0]["study"] == "3":
        return study3(rows, out)
    if rows and rows[0]["study"] == "4":
        return study4(rows, out)
    groups = defaultdict(list)
    for r in rows:
        groups[(r["study"], r["estimand"], float(r["param"]))].append(r)
    for (study, estimand, param), rs in sorted(groups.items()):
        ns = sorted({int(r["n"]) for r in rs})
        methods = list(dict.fromkeys(r["method"] for r in rs))
        fig, axes = plt.subplots(len(METRICS), len(ns), figsize=(4 * len(ns), 2.6 * len(METRICS)), squeeze=False)
        for j, n in enumerate(ns):
            for i, (key, label) in enumerate(METRICS):
                ax = axes[i][j]
                for m in methods:
                    pts = sorted(
                        (float(r["log_epsilon"]), float(r[key])) for r in rs if int(r["n"]) == n and r["method"] == m
                    )
                    color, ls = STYLE.get(m, (None, "-"))
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=color, label=m, lw=1.4)
                if key == "coverage":
                    ax.axhline(0.95, color="grey", lw=0.6)
                    ax.set_ylim(0, 1.02)
                if key == "bias":
                    ax.axhline(0.0, color="grey", lw=0.6)
                if key in ("rmse", "width"):
                    ax.set_yscale("log")
                if i == 0:
                    ax.set_title(f"n = {n}")
                if j == 0:
                    ax.set_ylabel(label)
                if i == len(METRICS) - 1:
                    ax.set_xlabel("ln ε")
        axes[0][-1].legend(fontsize=8)
        name = "pi" if study == "1" else ("sigma2" if estimand == "sigma2" else "mu")
        pname = "pi" if study == "1" else "sigma2"
        what = {"pi": "π", "mu": "μ", "sigma2": "σ² (scaled by σ²)"}[estimand]
        fig.suptitle(f"002 study {study}: {what}, {'π' if study == '1' else 'σ²'} = {param:g}")
        fig.tight_layout()
        fig.savefig(f"{out}/study{study}-{name}-{pname}{param:g}.png", dpi=80)
        plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
