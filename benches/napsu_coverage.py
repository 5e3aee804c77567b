#!/usr/bin/env python3
"""Coverage over repeats run one per process (so a run cut short keeps its repeats):
    for i in $(seq 1 20); do
      dpflow-bench napsu-adult --nuts --epsilon 1 --repeats 1 --m 20 --seed $i > DIR/e1-s$i.json
    done
    benches/napsu_coverage.py DIR/e1-s*.json
Prints, per coefficient, repeats covering the real-data value and the mean interval width."""
import json
import sys

rows, terms = [], None
for path in sys.argv[1:]:
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        continue  # a repeat still running
    terms = d["terms"]
    rows.append(d["results"][0])
ok = [r for r in rows if not r["failures"]]
print(f"{len(ok)} repeats ({len(rows) - len(ok)} failed or refused)")
for i, t in enumerate(terms or []):
    cov = sum(r["coverage"][i] for r in ok)
    width = sum(r["mean_width"][i] for r in ok) / max(len(ok), 1)
    print(f"{t:28s} covered {cov:.0f}/{len(ok)}  mean width {width:.4g}")
secs = sorted(r["inference_seconds"] for r in ok)
if secs:
    print(f"inference s: median {secs[len(secs) // 2]:.0f}, range {secs[0]:.0f}-{secs[-1]:.0f}")
    print("max k-hat:", max(r["max_pareto_k"] for r in ok), " min importance ESS:",
          round(min(r["min_importance_ess"] for r in ok)))
