#!/usr/bin/env python3
"""PGM estimation on a large domain (issue #5): A attributes of size S joined in
a chain of 2-way cliques (A-1 two-way and A one-way noisy measurements of a
random chain model), written in the `dpflow-bench pgm-measurements` JSON shape
and estimated with `dpflow-bench pgm` (and, with --mbi-python, with private-pgm
mbi 2.0 through benches/pgm_vs_mbi.py).

    benches/pgm_chain.py --bin target/release/dpflow-bench --attrs 100 --size 10 \
        [--mbi-python .venv-mbi/bin/python]
"""
import argparse
import json
import os
import random
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "dpflow-bench"))
    ap.add_argument("--attrs", type=int, default=100)
    ap.add_argument("--size", type=int, default=10)
    ap.add_argument("--total", type=float, default=1e6)
    ap.add_argument("--sigma", type=float, default=20.0)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mbi-python")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    names = [f"a{i}" for i in range(a.attrs)]
    s = a.size
    # A random chain model: p(a0) p(a1|a0) ... with Dirichlet-ish rows.
    def dist(k):
        w = [rng.expovariate(1.0) for _ in range(k)]
        t = sum(w)
        return [x / t for x in w]
    first = dist(s)
    conds = [[dist(s) for _ in range(s)] for _ in range(a.attrs - 1)]
    marg = [first]
    pairs = []
    for i in range(a.attrs - 1):
        pm = marg[-1]
        joint = [pm[x] * conds[i][x][y] for x in range(s) for y in range(s)]
        pairs.append(joint)
        marg.append([sum(joint[x * s + y] for x in range(s)) for y in range(s)])
    noisy = lambda p: [a.total * v + rng.gauss(0.0, a.sigma) for v in p]  # noqa: E731
    ms = [{"clique": [names[i]], "sigma": a.sigma, "values": noisy(marg[i])} for i in range(a.attrs)]
    ms += [{"clique": [names[i], names[i + 1]], "sigma": a.sigma, "values": noisy(pairs[i])}
           for i in range(a.attrs - 1)]
    doc = {"domain": [[n, s] for n in names], "total": a.total, "measurements": ms}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
        path = f.name
    print(f"{a.attrs} attributes of size {s} (domain {s}^{a.attrs}), {len(ms)} measurements")
    r = subprocess.run(["/usr/bin/time", "-f", "peak RSS %M KB", a.bin, "pgm", "--measurements", path,
                        "--iters", str(a.iters)], capture_output=True, text=True, check=True)
    print(r.stdout.strip())
    print(r.stderr.strip().splitlines()[-1])
    if a.mbi_python:
        r = subprocess.run(["/usr/bin/time", "-f", "peak RSS %M KB", a.mbi_python,
                            os.path.join(ROOT, "benches", "pgm_vs_mbi.py"), path, "--iters", str(a.iters)],
                           capture_output=True, text=True, check=True)
        print(r.stdout.strip())
        print(r.stderr.strip().splitlines()[-1])
    os.remove(path)


if __name__ == "__main__":
    main()
