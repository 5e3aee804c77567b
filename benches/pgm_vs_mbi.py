#!/usr/bin/env python3
"""Private-PGM estimation peer comparison (issue #5).

Feeds the same noisy measurements (written by `dpflow-bench pgm-measurements`)
to private-pgm's mbi 2.0 `mirror_descent` and reports the objective
sum_i ||M_i(mu) - y_i||^2 / (2 sigma_i) and the wall time, in the same JSON
shape as `dpflow-bench pgm`. Run it with a Python that has `mbi==2.0.0`:

    python3 -m venv .venv-mbi && .venv-mbi/bin/pip install mbi==2.0.0
    .venv-mbi/bin/python benches/pgm_vs_mbi.py MEASUREMENTS.json --iters 1000
"""
import argparse
import json
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64, like dpflow
jax.config.update("jax_enable_compilation_cache", False)

import numpy as np  # noqa: E402
from mbi import Domain, LinearMeasurement, estimation  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("measurements")
    ap.add_argument("--iters", type=int, default=1000)
    a = ap.parse_args()
    f = json.load(open(a.measurements))
    names = [n for n, _ in f["domain"]]
    sizes = [s for _, s in f["domain"]]
    domain = Domain(names, sizes)
    ms = []
    for m in f["measurements"]:
        shape = [sizes[names.index(c)] for c in m["clique"]]
        y = np.array(m["values"], dtype=float)
        assert y.size == int(np.prod(shape))
        ms.append(LinearMeasurement(y, tuple(m["clique"]), stddev=m["sigma"]))
    total = f["total"]
    est = estimation.MirrorDescent()
    # First call includes JAX compilation; time a second, identical call too.
    t0 = time.time()
    model = est.estimate(domain, ms, known_total=total, iters=a.iters)
    first_s = time.time() - t0
    t0 = time.time()
    model = est.estimate(domain, ms, known_total=total, iters=a.iters)
    secs = time.time() - t0
    inv_sigma = inv_var = 0.0
    for m in f["measurements"]:
        mu = np.asarray(model.project(tuple(m["clique"])).datavector())
        d = mu - np.array(m["values"])
        inv_sigma += float(d @ d) / (2 * m["sigma"])
        inv_var += float(d @ d) / (2 * m["sigma"] ** 2)
    print(json.dumps({"engine": "mbi-2.0.0 MirrorDescent", "iterations": a.iters,
                      "objective_inverse_sigma": inv_sigma, "objective_inverse_variance": inv_var,
                      "weighting": "inverse_variance", "seconds": secs,
                      "seconds_first_call_with_jit": first_s}, indent=2))


if __name__ == "__main__":
    main()
