#!/usr/bin/env python3
"""NAPSU-MQ on Adult-reduced with twinify: the peer run for `dpflow-bench napsu-adult`.

It does with twinify's NAPSU-MQ (Räisä et al., 003 §5.2 / App. E) what
`benches/src/napsu_adult.rs` does with dpflow's: same reduced table, same
twelve full-marginal queries, same ε list with δ = n⁻², the same downstream
analysis (logistic regression income ~ age + race + sex) and the same rule for
combining the m synthetic sets, so coverage, interval width and inference time
can be set side by side.

Per ε and repeat it

1. runs what `twinify.napsu_mq.NapsuMQModel.fit` runs, step by step through
   twinify's own modules, so that the inference and its sizes can be chosen
   (`fit` fixes NUTS at 4 chains, 800 warm-up and 2000 draws and has no
   Laplace-only mode): canonical queries (`FullMarginalQuerySet`), the Markov
   network (`MarkovNetwork`), the exact statistics plus Gaussian noise with
   σ = `privacy_accounting.sigma(ε, δ, √(2k))` for k queries, and then
   - `--inference laplace`: `maximum_entropy_inference.run_numpyro_laplace_
     approximation` (BFGS to the mode, Hessian there), and m draws of the
     normal approximation;
   - `--inference nuts`: the same Laplace approximation and then
     `run_numpyro_mcmc_normalised` (NUTS, tree depth 12, preconditioned by the
     Laplace approximation: `fit`'s default), and m distinct draws of the
     pooled chains;
2. samples n rows from the model at each of the m draws (`MarkovNetwork.
   sample`, which `NapsuMQResult.generate` calls; `generate` itself picks
   draws with replacement, so two sets could share one), fits the regression
   to each with statsmodels, and combines the m fits by the rule for fully
   synthetic data (Raghunathan, Reiter & Rubin 2003; 003 App. B;
   ../shared/papers/NOTES.md §7):
   q̄ = mean q_j, b = Σ (q_j − q̄)²/(m − 1), ū = mean u_j,
   T = (1 + 1/m)·b − ū with ν = (m − 1)(1 − m·ū/((m + 1)·b))² degrees of
   freedom; when T ≤ 0, T* = max(0, T) + (n_syn/n)·ū = ū with the normal
   reference (as dpflow's `analyze::combine`);
3. checks whether each 95% interval covers the coefficient that the same
   regression gives on the real reduced data.

`coverage_twinify_rule` repeats the check with twinify's own
`rubins_rules.non_negative_conf_int`, which differs only in the fallback:
it keeps the t reference with the ν above when T ≤ 0.

Inference time (`inference_seconds`) is the wall time of step 1: building the
queries and network, adding the noise, the Laplace approximation, NUTS and
taking the draws; it includes JAX's compilation, which twinify pays again on
every call (each call builds new closures). Data preparation, synthetic data
and regressions are timed apart (`synthesis_seconds`).

Set-up (outside the repository):

    python3 -m venv /work/venv-twinify
    /work/venv-twinify/bin/pip install twinify==2.0.0 statsmodels \\
        "jax==0.4.23" "jaxlib==0.4.23" "numpyro==0.11.0" "scipy<1.13" "matplotlib<3.10"

(twinify 2.0.0 imports `jax.config`, gone from jax 0.4.25 on; numpyro ≥ 0.12
rejects twinify's constraint classes; jax 0.4.23 needs scipy < 1.13; arviz
needs matplotlib < 3.10. twinify's own pins, `twinify[compatible-dependencies]`
= jax 0.3.23 and numpyro 0.10.1, cannot be installed: the registry has jaxlib
0.4.13 and later only, for Python 3.10 as for 3.11.)

twinify's Laplace approximation (jax.scipy's BFGS in a `while_loop`, tolerance
1e-2 on the largest gradient entry, up to five starts, each compiled anew) is
the weak point on this machine: compiling the loop takes about 90 s even for
a 19-parameter model, and with noisy statistics its line search can stop far
from the mode (status 3) on every start, so `fit` raises ConvergenceException;
such repeats count as `failures`. `--laplace-optimizer scipy` keeps twinify's
model, initialisation, tolerance, retries and Hessian but runs SciPy's BFGS
instead; it is not twinify's code path and the report says so
(`laplace_optimizer`). `--fast-compile` lowers XLA's optimisation level, for
smoke tests only.

Usage (from the repository root):

    /work/venv-twinify/bin/python benches/napsu_twinify.py \\
        --epsilon 0.1,0.3,0.5,1 --repeats 20 --m 100 --inference laplace
    /work/venv-twinify/bin/python benches/napsu_twinify.py \\
        --inference nuts --chains 4 --warmup 800 --draws 2000

Each ε prints one JSON object on a line of standard output (and appends it to
`--out` if given); progress goes to standard error. `--threads N` pins the
process to N cores and tells XLA and BLAS to use N threads; the default uses
every core, as dpflow's bench does. `--queries` replaces the twelve queries
(they must mention every column: twinify's junction tree fails otherwise) and
`--columns` keeps only some columns; both are for smoke tests, e.g.

    /work/venv-twinify/bin/python benches/napsu_twinify.py --epsilon 1 \
        --repeats 1 --m 5 --columns age,race,sex,income \
        --queries age-income,race-income,sex-income --laplace-optimizer scipy
"""

import argparse
import json
import os
import resource
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_INPUT = os.path.join(HERE, "..", "sample_data", "adult", "adult.data")

# Column order of the reduced table and the UCI field each comes from.
COLUMNS = ["age", "workclass", "education", "marital", "race", "sex", "gain", "loss", "hours", "income"]
FIELDS = [0, 1, 3, 5, 8, 9, 10, 11, 12, 14]

# The twelve queries of `queries()` in benches/src/napsu_adult.rs: App. E's
# fixed five and the seven its MST picked.
QUERIES = [
    ("age", "hours"),
    ("race", "hours"),
    ("sex", "hours"),
    ("hours", "income"),
    ("race", "sex"),
    ("age", "income"),
    ("marital", "income"),
    ("education", "income"),
    ("gain", "income"),
    ("loss", "income"),
    ("age", "marital"),
    ("workclass", "education"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default=DEFAULT_INPUT, help="UCI adult.data (default: sample_data/adult/adult.data)")
    p.add_argument("--epsilon", default="0.1,0.3,0.5,1", help="comma-separated ε values")
    p.add_argument("--repeats", type=int, default=20, help="repeats per ε")
    p.add_argument("--m", type=int, default=100, help="synthetic sets per repeat (003 App. E: 100)")
    p.add_argument("--inference", choices=["laplace", "nuts"], default="laplace")
    p.add_argument("--chains", type=int, default=4, help="NUTS chains (twinify's fit: 4)")
    p.add_argument("--warmup", type=int, default=800, help="NUTS warm-up per chain (twinify's fit: 800)")
    p.add_argument("--draws", type=int, default=2000, help="NUTS draws per chain (twinify's fit: 2000)")
    p.add_argument("--seed", type=int, default=0, help="seed (a simulation: seeded noise is fine here)")
    p.add_argument("--threads", type=int, default=None, help="cores/threads to use (default: all)")
    p.add_argument("--queries", default=None, help="override, e.g. age-income,race-sex (default: the twelve)")
    p.add_argument("--columns", default=None,
                   help="keep only these columns (smoke tests; must include age,race,sex,income; default: all ten)")
    p.add_argument("--laplace-optimizer", choices=["twinify", "scipy"], default="twinify",
                   help="twinify's jax.scipy BFGS (default) or SciPy's BFGS on twinify's model (not twinify's code path)")
    p.add_argument("--fast-compile", action="store_true",
                   help="lower XLA's optimisation (faster compiles, slower code): smoke tests only")
    p.add_argument("--out", default=None, help="also append each ε's JSON line to this file")
    a = p.parse_args(argv)
    a.epsilon = [float(e) for e in a.epsilon.split(",") if e.strip()]
    a.columns = [c.strip() for c in a.columns.split(",") if c.strip()] if a.columns else list(COLUMNS)
    bad = [c for c in a.columns if c not in COLUMNS]
    if bad or not {"age", "race", "sex", "income"} <= set(a.columns):
        p.error(f"--columns: must be among {COLUMNS} and include age, race, sex and income")
    if a.queries:
        a.queries = [tuple(q.split("-")) for q in a.queries.split(",") if q.strip()]
    else:
        a.queries = list(QUERIES)
    for q in a.queries:
        bad = [c for c in q if c not in a.columns]
        if bad:
            p.error(f"--queries: unknown column(s) {bad}; columns are {a.columns}")
    missing = [c for c in a.columns if not any(c in q for q in a.queries)]
    if missing:  # twinify's junction tree fails on a column no query mentions
        p.error(f"--queries must mention every column; missing {missing}")
    if a.m < 2:
        p.error("--m must be at least 2 (the between-set variance needs two sets)")
    return a


def limit_threads(threads):
    """Restricts the process to `threads` cores; must run before numpy/jax load.

    XLA sizes its CPU thread pools by the cores the process may run on, so
    the affinity is what limits it; one thread also turns off Eigen's
    multi-threading."""
    if threads is None:
        return
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cpus)
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(threads)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None):
    args = parse_args(argv)
    limit_threads(args.threads)
    if args.fast_compile:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                                   " --xla_llvm_disable_expensive_passes=true").strip()
    os.environ.setdefault("TQDM_DISABLE", "1")  # twinify's canonical-query progress bars
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)

    import numpy as np
    import pandas as pd
    import scipy.optimize as sopt
    import scipy.stats as st
    import statsmodels.api as sm

    import twinify  # sets jax_enable_x64
    import jax
    import numpyro
    import d3p.random
    from twinify.dataframe_data import DataFrameData
    from twinify.napsu_mq import maximum_entropy_inference as mei
    from twinify.napsu_mq import privacy_accounting, rubins_rules
    from twinify.napsu_mq.marginal_query import FullMarginalQuerySet
    from twinify.napsu_mq.markov_network import MarkovNetwork
    from numpyro.diagnostics import split_gelman_rubin
    from twinify.napsu_mq import maximum_entropy_model as mem

    # ---- Adult-reduced, as `reduce` in benches/src/napsu_adult.rs.
    raw = pd.read_csv(args.input, header=None, dtype=str, skipinitialspace=True)
    raw = raw.apply(lambda s: s.str.strip())
    raw = raw.dropna(how="all")
    raw = raw[~(raw == "?").any(axis=1)]
    df = raw[FIELDS].copy()
    df.columns = COLUMNS
    df["income"] = df["income"].str.rstrip(".")
    age = df["age"].astype(float)
    lo, hi = age.min(), age.max()
    age_mid = [lo + (hi - lo) / 5 * (i + 0.5) for i in range(5)]  # equal-width midpoints, as dpflow
    df["age"] = pd.cut(age, 5, labels=False)
    df["hours"] = pd.cut(df["hours"].astype(float), 5, labels=False)
    for c in ("gain", "loss"):
        df[c] = (df[c].astype(float) > 0).astype(int)
    for c in COLUMNS:
        df[c] = pd.Categorical(df[c], categories=sorted(df[c].unique()))
    df = df[args.columns].reset_index(drop=True)
    n = len(df)
    sizes = [len(df[c].cat.categories) for c in args.columns]
    race_levels = list(df["race"].cat.categories)
    sex_levels = list(df["sex"].cat.categories)
    log(f"Adult-reduced: {n} rows, sizes {sizes}")

    terms = ["Intercept"] + [f"race[T.{r}]" for r in race_levels[1:]] + [f"sex[T.{sex_levels[1]}]", "age"]
    age_mid_arr = np.asarray(age_mid)

    def design(codes):
        """income ~ age + race + sex, treatment coding, from a frame of category codes."""
        race = codes["race"].to_numpy()
        x = [np.ones(len(race))]
        x += [(race == r).astype(float) for r in range(1, len(race_levels))]
        x.append((codes["sex"].to_numpy() == 1).astype(float))
        x.append(age_mid_arr[codes["age"].to_numpy()])
        return np.column_stack(x), codes["income"].to_numpy().astype(float)

    def logit(codes):
        """(estimates, variances) or None when the fit fails."""
        x, y = design(codes)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = sm.Logit(y, x).fit(disp=0, method="newton", maxiter=100)
                est, var = np.asarray(r.params), np.diag(np.asarray(r.cov_params()))
        except Exception:  # singular design (a level absent), no convergence, ...
            return None
        if not (np.all(np.isfinite(est)) and np.all(np.isfinite(var)) and np.all(var > 0)):
            return None
        return est, var

    codes_real = pd.DataFrame({c: df[c].cat.codes for c in args.columns})
    real_fit = logit(codes_real)
    if real_fit is None:
        raise SystemExit("the regression on the real data failed")
    real = real_fit[0]
    p = len(real)

    def combine(q, u):
        """95% interval by the fully-synthetic rule (n_syn = n); (low, high, fell_back)."""
        m = len(q)
        qbar, b, ubar = q.mean(), q.var(ddof=1), u.mean()
        t = (1 + 1 / m) * b - ubar
        if t > 0:
            nu = (m - 1) * (1 - m * ubar / ((m + 1) * b)) ** 2
            z = st.t.ppf(0.975, nu)
            return qbar - z * np.sqrt(t), qbar + z * np.sqrt(t), False
        z = st.norm.ppf(0.975)
        return qbar - z * np.sqrt(ubar), qbar + z * np.sqrt(ubar), True

    def laplace(key, noisy, n, sigma, mn):
        """The Laplace approximation: twinify's, or (opt-in) twinify's model with SciPy's BFGS."""
        if args.laplace_optimizer == "twinify":
            return mei.run_numpyro_laplace_approximation(key, noisy, n, sigma, mn)[0]
        # As mei.run_numpyro_laplace_approximation (same model, prior, initialisation, tolerance on
        # the largest gradient entry, retries, Hessian), but SciPy's BFGS instead of jax.scipy's.
        keys = jax.random.split(key, 6)[1:]
        for k in keys:
            init, potential, _, _ = numpyro.infer.util.initialize_model(
                k, mem.normal_prior_model_numpyro, model_args=(noisy, n, sigma, 0, 10, mn))
            f = lambda lam: potential({"lambdas": lam})  # noqa: E731
            vg = jax.jit(jax.value_and_grad(f))
            res = sopt.minimize(lambda x: tuple(np.asarray(v, dtype=float) for v in vg(jax.numpy.asarray(x))),
                                np.asarray(init[0]["lambdas"]), jac=True, method="BFGS", options={"gtol": 1e-2})
            if np.max(np.abs(res.jac)) <= 1e-2:
                mean = jax.numpy.asarray(res.x)
                return numpyro.distributions.MultivariateNormal(loc=mean, precision_matrix=jax.hessian(f)(mean))
        raise mei.ConvergenceException(f"SciPy BFGS did not converge in {len(keys)} tries: {res.message}")

    delta = 1.0 / n**2
    sensitivity = float(np.sqrt(2 * len(args.queries)))
    versions = {
        "python": sys.version.split()[0],
        "twinify": twinify.__version__,
        "jax": jax.__version__,
        "jaxlib": __import__("jaxlib").__version__,
        "numpyro": numpyro.__version__,
        "statsmodels": __import__("statsmodels").__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
    }
    base_key = d3p.random.PRNGKey(args.seed)

    for ei, epsilon in enumerate(args.epsilon):
        start = time.time()
        sigma = privacy_accounting.sigma(epsilon, delta, sensitivity)
        covered = np.zeros(p)
        covered_tw = np.zeros(p)
        width = np.zeros(p)
        fallbacks = np.zeros(p, dtype=int)
        inference_s, synthesis_s, rhats, divergences = [], [], [], []
        done = failures = failed_fits = 0
        for repeat in range(args.repeats):
            key = d3p.random.fold_in(d3p.random.fold_in(base_key, ei), repeat)
            run_key, synth_key = d3p.random.split(key, 2)
            inference_rng, dp_rng = d3p.random.split(run_key, 2)  # as fit splits its rng
            t0 = time.time()
            try:
                # What NapsuMQModel.fit does with user-given query sets.
                data = DataFrameData(df)
                queries = FullMarginalQuerySet(args.queries, data.values_by_col).get_canonical_queries()
                mn = MarkovNetwork(data.values_by_col, queries)
                suff_stat = np.sum(queries.flatten()(data.int_df.to_numpy()), axis=0)
                noisy = suff_stat + d3p.random.normal(dp_rng, suff_stat.shape) * sigma
                jkey = d3p.random.convert_to_jax_rng_key(inference_rng)
                approx_key, mcmc_key, draw_key = jax.random.split(jkey, 3)
                la = laplace(approx_key, noisy, n, sigma, mn)
                if args.inference == "laplace":
                    thetas = np.asarray(la.sample(draw_key, (args.m,)))
                else:
                    mcmc, back = mei.run_numpyro_mcmc_normalised(
                        mcmc_key, noisy, n, sigma, mn, la, num_samples=args.draws, num_warmup=args.warmup,
                        num_chains=args.chains, disable_progressbar=True)
                    by_chain = np.asarray(mcmc.get_samples(group_by_chain=True)["norm_lambdas"])
                    if args.chains > 1:
                        rhats.append(float(np.nanmax(split_gelman_rubin(by_chain))))
                    divergences.append(int(np.sum(np.asarray(mcmc.get_extra_fields()["diverging"]))))
                    pooled = np.asarray(back(by_chain.reshape(-1, by_chain.shape[-1])))
                    pick = jax.random.choice(draw_key, pooled.shape[0], (min(args.m, pooled.shape[0]),), replace=False)
                    thetas = pooled[np.asarray(pick)]
                thetas = np.asarray(thetas)
                if not np.all(np.isfinite(thetas)):
                    raise FloatingPointError("non-finite posterior draws")
            except Exception as e:  # mei.ConvergenceException and anything NUTS raises
                failures += 1
                log(f"ε={epsilon} repeat {repeat}: inference failed: {type(e).__name__}: {e}")
                if os.environ.get("NAPSU_TWINIFY_TRACEBACK"):
                    traceback.print_exc()
                continue
            inference_s.append(time.time() - t0)

            t1 = time.time()
            q, u = [], []
            keys = jax.random.split(d3p.random.convert_to_jax_rng_key(synth_key), len(thetas))
            for theta, k in zip(thetas, keys):
                syn = mn.sample(k, jax.numpy.asarray(theta), n)  # codes, as generate() maps to categories
                fit = logit(syn)
                if fit is None:
                    failed_fits += 1
                    continue
                q.append(fit[0])
                u.append(fit[1])
            synthesis_s.append(time.time() - t1)
            if len(q) < 2:
                failures += 1
                log(f"ε={epsilon} repeat {repeat}: fewer than two synthetic fits")
                continue
            q, u = np.array(q), np.array(u)
            for k in range(p):
                lo_, hi_, fb = combine(q[:, k], u[:, k])
                covered[k] += lo_ <= real[k] <= hi_
                width[k] += hi_ - lo_
                fallbacks[k] += fb
                lo_tw, hi_tw = rubins_rules.non_negative_conf_int(q[:, k], u[:, k], 0.95, n, n)
                covered_tw[k] += lo_tw <= real[k] <= hi_tw
            done += 1
            log(f"ε={epsilon} repeat {repeat}: inference {inference_s[-1]:.1f}s, "
                f"synthesis+fits {synthesis_s[-1]:.1f}s, {len(q)} fits")

        d = max(done, 1)
        report = {
            "system": "twinify",
            "epsilon": epsilon,
            "delta": delta,
            "sigma": sigma,
            "sensitivity": sensitivity,
            "inference": args.inference,
            "nuts": ({"chains": args.chains, "warmup": args.warmup, "draws": args.draws, "max_tree_depth": 12}
                     if args.inference == "nuts" else None),
            "n": n,
            "columns": args.columns,
            "sizes": sizes,
            "parameters": int(mn.lambda_d) if done else None,
            "queries": [list(qs) for qs in args.queries],
            "m": args.m,
            "seed": args.seed,
            "laplace_optimizer": args.laplace_optimizer,
            "threads": args.threads,
            "fast_compile": args.fast_compile,
            "repeats": done,
            "failures": failures,
            "failed_synthetic_fits": failed_fits,
            "terms": terms,
            "real": real.tolist(),
            "coverage": (covered / d).tolist(),
            "coverage_twinify_rule": (covered_tw / d).tolist(),
            "mean_width": (width / d).tolist(),
            "fallbacks": fallbacks.tolist(),
            "inference_seconds": float(np.mean(inference_s)) if inference_s else None,
            "inference_seconds_each": [round(s, 3) for s in inference_s],
            "synthesis_seconds": float(np.mean(synthesis_s)) if synthesis_s else None,
            "max_rhat": max(rhats) if rhats else None,
            "divergences": sum(divergences) if divergences else None,
            "seconds": time.time() - start,
            "peak_rss_mb": peak_rss_mb(),
            "versions": versions,
        }
        line = json.dumps(report)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
