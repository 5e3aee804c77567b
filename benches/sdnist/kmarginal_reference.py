"""SDNist's k-marginal score of the committed synthetic files against the real
ma2019 excerpt: the expected values of `tests/it/eval.rs`
(`kmarginal_score_equals_sdnists`).

    python3 -m venv /tmp/sdnist && /tmp/sdnist/bin/pip install sdnist==2.4
    /tmp/sdnist/bin/python benches/sdnist/kmarginal_reference.py > tests/data/sdnist/expected.json

The synthetic files are written by `benches/sdnist/make_files.sh`. Both sides
see the columns of `tests/data/sdnist/kmarginal.domain.yaml` (none binned) as
strings; a null (empty in dpflow's CSV, "N" in the excerpt) is the category "N".
SDNist is run as its CRC report runs it: grouped by PUMA.
"""
import json
import pathlib
import re

import pandas as pd
import sdnist.report  # noqa: F401  (sdnist.metrics.kmarginal needs sdnist.report imported first)
from sdnist.metrics.kmarginal import KMarginal

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/data/sdnist"
DOMAIN = (DATA / "kmarginal.domain.yaml").read_text()
COLUMNS = re.findall(r"- \{name: (\w+),", DOMAIN)
FILES = ["independent", "mst", "privbayes"]


def load(path):
    df = pd.read_csv(path, dtype=str, keep_default_na=False)[COLUMNS]
    return df.replace("", "N")


real = load(ROOT / "sample_data/nist-acs/ma2019.csv")
out = {}
for name in FILES:
    syn = load(DATA / f"{name}.csv")
    grouped = KMarginal(real, syn, ["PUMA"])
    grouped.compute_score()
    plain = KMarginal(real, syn)
    plain.compute_score()
    out[name] = {
        "score": float(grouped.score),
        "groups": {str(g): float(v) for g, v in grouped.scores.items()},
        "score_without_groups": float(plain.score),
    }
print(json.dumps(out, indent=2, sort_keys=True))
