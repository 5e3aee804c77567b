"""Reference values for `dpflow analyze` from statsmodels (tests/it/analyze.rs).

Writes tests/data/analyze/data.csv (a seeded random data set with a numeric
and a categorical predictor, nulls included) and expected.json: OLS and
logistic regression coefficients and standard errors as statsmodels'
formula interface reports them (missing='drop', non-robust covariance),
plus a mean and a proportion.

    python3 -m venv /tmp/sm && /tmp/sm/bin/pip install statsmodels pandas
    /tmp/sm/bin/python benches/analyze/statsmodels_reference.py
"""
import json
import pathlib

import numpy as np
import pandas as pd
import statsmodels
import statsmodels.formula.api as smf

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "analyze"
OUT.mkdir(parents=True, exist_ok=True)

rng = np.random.default_rng(20261123)
n = 400
x1 = rng.normal(40, 12, n).round(1)
x2 = rng.integers(0, 5, n)
g = rng.choice(["north", "south", "east"], n, p=[0.5, 0.3, 0.2])
effect = {"north": 0.0, "south": 1.5, "east": -2.0}
y = 3.0 + 0.25 * x1 - 0.8 * x2 + np.array([effect[v] for v in g]) + rng.normal(0, 3, n)
eta = -4.0 + 0.08 * x1 + np.array([effect[v] * 0.5 for v in g])
b = rng.random(n) < 1 / (1 + np.exp(-eta))
df = pd.DataFrame({"y": y.round(3), "x1": x1, "x2": x2, "g": g, "b": np.where(b, "yes", "no")})
# Nulls: a few in y, x1 and g (dropped row-wise by both tools).
for col, k in [("y", 7), ("x1", 5), ("g", 4)]:
    df.loc[rng.choice(n, k, replace=False), col] = None
df["x2"] = df["x2"].astype("Int64")
df.to_csv(OUT / "data.csv", index=False)

# Read back as both tools will read the file.
data = pd.read_csv(OUT / "data.csv")
expected = {"statsmodels": statsmodels.__version__}


def fit(model):
    return {"params": model.params.to_dict(), "bse": model.bse.to_dict(), "nobs": int(model.nobs)}


expected["ols"] = {"formula": "y ~ x1 + x2 + g", **fit(smf.ols("y ~ x1 + x2 + g", data, missing="drop").fit())}
data["b1"] = (data["b"] == "yes").astype(float)
logit = smf.logit("b1 ~ x1 + g", data, missing="drop").fit(disp=0, tol=1e-12, maxiter=100)
expected["logistic"] = {"formula": "b == 'yes' ~ x1 + g", **fit(logit)}
ys = data["y"].dropna()
expected["mean"] = {"column": "y", "estimate": ys.mean(), "se": ys.std(ddof=1) / np.sqrt(len(ys))}
bs = data["b"].dropna() == "yes"
p = bs.mean()
expected["proportion"] = {"column": "b", "value": "yes", "estimate": p, "se": np.sqrt(p * (1 - p) / len(bs))}
(OUT / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
print(json.dumps(expected, indent=2, sort_keys=True))
