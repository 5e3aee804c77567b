"""Expected RDP values of the Poisson-subsampled Gaussian mechanism, from
Google's dp-accounting, for tests/it/rdp_dp_accounting.rs (issue 18 item 1).

    python3 -m venv /tmp/dpa && /tmp/dpa/bin/pip install dp-accounting==0.6.0
    /tmp/dpa/bin/python benches/privacy/dp_accounting_reference.py > tests/data/rdp/dp_accounting.json

For each (q, σ, steps) on the grid, it composes `steps` PoissonSampledDpEvent(q,
GaussianDpEvent(σ)) in an RdpAccountant (add/remove-one neighbours, the default
156 orders) and records the RDP at every order (null where dp-accounting's
series did not converge and it excludes the order) and ε at two δ.
"""
import json
import math

import dp_accounting
from dp_accounting import rdp

QS = [0.001, 0.01, 0.1, 0.5]
SIGMAS = [0.6, 1.0, 2.0, 5.0]
STEPS = [1, 1000]
DELTAS = [1e-5, 1e-9]

def finite(x):
    """JSON has no infinity: an order dp-accounting excludes (its series did
    not converge) is written as null."""
    x = float(x)
    return x if math.isfinite(x) else None


cases = []
for q in QS:
    for sigma in SIGMAS:
        for steps in STEPS:
            acc = rdp.RdpAccountant()
            event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
            acc.compose(event, steps)
            cases.append({
                "q": q,
                "sigma": sigma,
                "steps": steps,
                "orders": [float(a) for a in acc._orders],
                "rdp": [finite(r) for r in acc._rdp],
                "epsilon": {repr(d): float(acc.get_epsilon(d)) for d in DELTAS},
            })
print(json.dumps({"dp_accounting": dp_accounting.__version__ if hasattr(dp_accounting, "__version__") else "0.6.0",
                  "cases": cases}))
