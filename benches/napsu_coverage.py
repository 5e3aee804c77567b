#!/usr/bin/env python3
"""Coverage over repeats run one per process (so a run cut short keeps its repeats):
    for i in $(seq 1 20); do
      dpflow-bench napsu-adult --nuts --epsilon 1 --repeats 1 --m 100 --seed $i > DIR/e1-s$i.json
    done
    benches/napsu_coverage.py DIR/e1-s*.json
Files with several repeats (--repeats R) count R times: their coverage and width are means.
Prints, per coefficient, repeats covering the real-data value, the mean interval width and the
median width over files (one synthetic set whose fit nearly separates can give an interval
10^5 wide, which the mean then shows for the whole column), then times and diagnostics.
--markdown prints one table row per coefficient instead."""
import json
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
markdown = "--markdown" in sys.argv
rows, terms = [], None
for path in args:
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        continue  # a repeat still running
    terms = d["terms"]
    r = d["results"][0]
    r["peak_rss_mb"] = d.get("peak_rss_mb")
    rows.append(r)
ok = [r for r in rows if not r["failures"] and not r.get("refused")]
n = sum(r["repeats"] for r in ok)


def weighted_median(pairs):
    pairs = sorted(pairs)
    total, acc = sum(w for _, w in pairs), 0
    for v, w in pairs:
        acc += w
        if acc >= total / 2:
            return v
    return float("nan")


print(f"{n} repeats in {len(ok)} files ({len(rows) - len(ok)} files failed or refused)")
for i, t in enumerate(terms or []):
    cov = sum(r["coverage"][i] * r["repeats"] for r in ok)
    width = sum(r["mean_width"][i] * r["repeats"] for r in ok) / max(n, 1)
    med = weighted_median([(r["mean_width"][i], r["repeats"]) for r in ok])
    if markdown:
        print(f"| {t} | {cov:.0f}/{n} = {cov / max(n, 1):.2f} | {width:.3g} | {med:.3g} |")
    else:
        print(f"{t:28s} covered {cov:.0f}/{n}  mean width {width:.4g}  median width {med:.4g}")
secs = sorted(r["inference_seconds"] for r in ok)
if secs:
    print(f"inference s (per file, a mean when a file has several repeats): median {secs[len(secs) // 2]:.0f}, "
          f"range {secs[0]:.0f}-{secs[-1]:.0f}")
    print("max R-hat of mu:", round(max(r["max_rhat_mean"] for r in ok), 3),
          " runs extended:", sum(r.get("extended", 0) for r in ok),
          " min bulk ESS of mu:", round(min(r["min_ess_mean"] for r in ok)))
    print("max k-hat:", round(max(r["max_pareto_k"] for r in ok), 3), " min importance ESS:",
          round(min(r["min_importance_ess"] for r in ok)),
          " peak RSS MB:", round(max(r["peak_rss_mb"] or 0 for r in ok)))
