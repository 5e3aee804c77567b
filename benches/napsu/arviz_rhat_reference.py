"""Reference values for dpflow's rank-normalised R-hat and bulk ESS
(`rank_diagnostics` in src/synth/napsu/nuts.rs, test
`rank_rhat_and_bulk_ess_match_arviz`), from ArviZ, which implements
Vehtari, Gelman, Simpson, Carpenter and Buerkner (2021).

The chains are made by a generator both languages compute bit for bit: an
LCG (glibc's constants) drives an AR(1) process, 4 chains x 201 draws (odd,
so the split drops the middle draw), chain c shifted by shift*c.

    python3 -m venv /tmp/venv-arviz && /tmp/venv-arviz/bin/pip install arviz
    /tmp/venv-arviz/bin/python benches/napsu/arviz_rhat_reference.py
"""
import math

import warnings

warnings.simplefilter("ignore", FutureWarning)
import arviz as az  # noqa: E402
import numpy as np


def chains(shift, draws=201):
    out = []
    for c in range(4):
        state = 12345 + 1000 * c
        x = 0.0
        chain = []
        for _ in range(draws):
            state = (1103515245 * state + 12345) % 2**31
            u = state / 2**31
            x = 0.8 * x + (u - 0.5)
            chain.append(x + shift * c)
        out.append(chain)
    return np.array(out)


def rare_cell(draws=400):
    """A rare cell's probability: chains 2 and 3 sit at twice the level of
    chains 0 and 1, and every chain has spikes 15-30 times the level every
    25 draws. The spikes dominate the within-chain variance, so plain
    split R-hat misses the disagreement; ranks do not."""
    x = chains(0.0, draws)
    out = np.empty_like(x)
    for c in range(4):
        for i in range(draws):
            level = 2e-4 if c >= 2 else 1e-4
            out[c, i] = level * math.exp(0.5 * x[c, i]) + (3e-3 if (i + 37 * c) % 25 == 0 else 0.0)
    return out


cases = {
    # Mixed chains, and chains clearly apart.
    "shift 0": chains(0.0),
    "shift 0.4": chains(0.4),
    # Ties (values on a grid of 1/4) under a monotone map.
    "grid exp": np.exp(np.floor(chains(0.1) * 4.0) / 4.0),
    "rare cell": rare_cell(),
}
print("arviz", az.__version__)
for name, x in cases.items():
    rank = float(az.rhat(x, method="rank"))
    split = float(az.rhat(x, method="split"))
    bulk = float(az.ess(x, method="bulk"))
    print(f"{name}: rank R-hat {rank!r}, split R-hat {split!r}, bulk ESS {bulk!r}")
