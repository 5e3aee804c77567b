#!/usr/bin/env python3
"""Plot of the 004 §6 experiment (issue #8), in the style of 004 Figs 4-6:
squared error of each estimator per query over the runs, log scale.

    dpflow-bench knn-experiment --runs 100 --csv benches/results/knn/experiment-100runs.csv
    python3 benches/knn_plot.py benches/results/knn/experiment-100runs.csv benches/results/knn/experiment.png

Needs matplotlib. Prints the MSE table it plots.
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src, out = sys.argv[1], sys.argv[2]
errors = defaultdict(list)
queries, estimators = [], []
with open(src) as f:
    for row in csv.DictReader(f):
        q, e = row["query"], row["estimator"]
        if q not in queries:
            queries.append(q)
        if e not in estimators:
            estimators.append(e)
        errors[(q, e)].append((float(row["estimate"]) - float(row["truth"])) ** 2)

print("| query | " + " | ".join(estimators) + " |")
print("|---|" + "---|" * len(estimators))
for q in queries:
    cells = []
    for e in estimators:
        v = errors[(q, e)]
        cells.append(f"{sum(v) / len(v):.3g} ({len(v)} runs)" if v else "-")
    print(f"| {q} | " + " | ".join(cells) + " |")

fig, axes = plt.subplots(1, len(queries), figsize=(4 * len(queries), 4))
for ax, q in zip(axes, queries):
    data = [[max(x, 1e-12) for x in errors[(q, e)]] for e in estimators]
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(estimators) + 1), [e.replace("-", "\n") for e in estimators])
    ax.set_yscale("log")
    ax.set_title(q, fontsize=9)
    ax.set_ylabel("squared error")
fig.suptitle("004 §6 on ma2019: ignore-missing vs global vs smooth sensitivity (ε = 6 ln 2 per number)")
fig.tight_layout()
fig.savefig(out, dpi=80)
print(f"wrote {out}")
