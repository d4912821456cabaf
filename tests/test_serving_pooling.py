"""Disaggregated prefill workers of one configuration share one prompt queue (M/G/(n·c)): the
pooled rates per worker, the ``pooling`` rows of the MILP against exhaustive search over the
counts, and a pooled plan checked by the simulation."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from constraints.serving import pooling
from optimizer.serving.perf import ServingModel
from optimizer.serving.solve import solve_mode
from objectives.serving import registry
from tests.serving_helpers import llama8b_raw, problem


def _prefill_workers(p):
    return [w for w in ServingModel(p).workers(("prefill",)) if w.rate > 0]


def test_pooled_rates_meet_the_ttft_target_and_are_tight():
    """At each breakpoint n_k the rate per worker r_k meets the TTFT quantile with n_k workers
    in one queue, 3 % more does not (unless a worker is nearly always busy), and r_k grows with n_k."""
    p = problem(llama8b_raw(rate=20.0, isl=4000, osl=200, ttft_ms=400, tpot_ms=50, servers=4, mode="disaggregated"))
    sm = ServingModel(p)
    pooled = [w for w in sm.workers(("prefill",)) if w.pooling]
    assert pooled, "the TTFT-bound prefill workers gain from pooling"
    for w in pooled:
        assert w.pooling[0] == (1, w.rate)
        ns = [n for n, _ in w.pooling]
        rs = [r for _, r in w.pooling]
        assert ns == sorted(set(ns)) and all(b >= a for a, b in zip(rs, rs[1:]))
        busy = w.layout.attention_dp / sm.prefill_figures(w, 0.0)["mean_prefill_s"]
        for n, r in w.pooling:
            assert sm.prefill_figures(w, r, n)["ttft_s"] <= p.ttft_s * (1 + 1e-9)
            if r < 0.97 * busy:
                assert sm.prefill_figures(w, r * 1.03, n)["ttft_s"] > p.ttft_s


def test_capacity_between_breakpoints_is_a_lower_bound():
    """``Worker.capacity(n)`` never exceeds what n workers in one queue carry (bisection at n)."""
    from optimizer.serving.perf import _bisect_max

    p = problem(llama8b_raw(rate=20.0, isl=4000, osl=200, ttft_ms=400, tpot_ms=50, servers=4, mode="disaggregated"))
    sm = ServingModel(p)
    for w in (w for w in sm.workers(("prefill",)) if w.pooling):
        hi = w.layout.attention_dp / sm.prefill_figures(w, 0.0)["mean_prefill_s"]
        for n in range(1, p.pools[w.pool].count // w.gpus + 1):
            exact = _bisect_max(lambda lam: sm.prefill_figures(w, lam, n)["ttft_s"] <= p.ttft_s, hi)
            assert w.capacity(n) <= n * exact * (1 + 1e-6), (w.layout.label(), n)
            assert w.capacity(n) >= n * w.rate * (1 - 1e-12)


def _brute_force(p, workers, rate, pooled: bool = True):
    """Fewest GPUs over every count vector of the usable prefill and decode configurations
    (``pooled=False``: each worker its own queue, ``rate`` per worker)."""
    cap = (lambda w, n: w.capacity(n)) if pooled else (lambda w, n: w.rate * n)
    pre = [j for j, w in enumerate(workers) if w.role == "prefill" and w.rate > 0]
    dec = [j for j, w in enumerate(workers) if w.role == "decode" and w.rate > 0]
    pool = p.pools[0].count
    best = None
    ranges = [range(pool // workers[j].gpus + 1) for j in pre + dec]
    for counts in itertools.product(*ranges):
        c = dict(zip(pre + dec, counts))
        g = sum(workers[j].gpus * n for j, n in c.items())
        if g > pool or (best is not None and g >= best):
            continue
        if sum(c[j] for j in pre) < 1 or sum(c[j] for j in dec) < 1:
            continue
        if sum(cap(workers[j], c[j]) for j in pre) < rate * (1 - 1e-9):
            continue
        if sum(cap(workers[j], c[j]) for j in dec) < rate * (1 - 1e-9):
            continue
        best = g
    return best


def _random_case(seed):
    rng = np.random.default_rng(seed)
    isl = int(rng.choice([2000, 4000, 8000]))
    raw = llama8b_raw(rate=float(rng.uniform(2, 30)), isl=isl, osl=int(rng.choice([100, 300])),
                      ttft_ms=float(rng.uniform(0.5, 2.0) * isl / 10), tpot_ms=50, servers=1, mode="disaggregated")
    raw["serving"]["prefill"] = {"tp": [1, 2]}
    raw["serving"]["decode"] = {"tp": [2, 4]}
    p = problem(raw, "gpus")
    return p, ServingModel(p).workers(("prefill", "decode"))


SEEDS = range(10)


@pytest.mark.parametrize("seed", SEEDS)
def test_fewest_gpus_equals_exhaustive_search_over_the_counts(seed):
    """Random Llama-3.1-8B disaggregated cases on one HGX H100 (few configurations, so every count
    vector can be listed): the MILP's GPUs equal the brute force over counts with the pooled
    capacities, and its plan carries the rate by those capacities."""
    p, workers = _random_case(seed)
    rate = p.rates[0]
    res = solve_mode(p, workers, "disaggregated", registry()["gpus"], rate)
    want = _brute_force(p, workers, rate)
    if want is None:
        assert res.counts is None
        return
    assert res.counts is not None
    got = sum(workers[j].gpus * n for j, n in res.counts.items())
    assert got == want
    assert sum(workers[j].capacity(n) for j, n in res.counts.items() if workers[j].role == "prefill") >= rate * (1 - 1e-6)


def test_the_random_cases_are_not_vacuous():
    """Among the random cases some plan needs fewer GPUs pooled than with one queue per worker
    (the property test above compares something pooling changes), and none needs more."""
    fewer = 0
    for seed in SEEDS:
        p, workers = _random_case(seed)
        a, b = _brute_force(p, workers, p.rates[0]), _brute_force(p, workers, p.rates[0], pooled=False)
        if b is not None:
            assert a is not None and a <= b
            fewer += a < b
    assert fewer >= 2, fewer


def test_rows_are_named_and_described():
    p = problem(llama8b_raw(rate=20.0, isl=4000, osl=200, ttft_ms=400, tpot_ms=50, servers=2, mode="disaggregated"))
    from optimizer.serving import PIPELINE

    m = PIPELINE.build(p)["disaggregated"]
    names = [n for n in m.h.getLp().row_names_ if n.startswith("pooling[")]
    assert names and all(n in m.rows for n in names)
    k = m.rows[names[-1]]
    assert "share one prompt queue" in pooling.describe(k, None)


def test_the_readme_disaggregated_plan_passes_the_simulation():
    """The README's Llama-3.1-70B example, disaggregated: two pooled TP2 prefill workers (three
    when each was its own queue) and the simulation's attainment meets the target."""
    from optimizer import serving
    from tests.serving_helpers import llama70b_raw

    d = serving.solve_instance(problem(llama70b_raw(mode="disaggregated"))).to_dict()
    m = d["plan"]["rates"][0]["modes"]["disaggregated"]
    pre = [g for g in m["workers"] if g["role"] == "prefill"]
    assert sum(g["count"] for g in pre) == 2
    assert m["simulated"]["attainment"] >= 0.9


def test_binding_rows_state_the_pooled_rate_the_plan_runs():
    """The ``ttft[prefill ...]`` binding and the worker group's ``limit_detail`` quote the rate per
    worker at the plan's count (pooled), not one worker's rate alone."""
    from optimizer import serving
    from tests.serving_helpers import llama70b_raw

    d = serving.solve_instance(problem(llama70b_raw(mode="disaggregated", traffic={"rate_rps": 25, "isl": 2000,
                                                                                      "osl": 256}))).to_dict()
    m = d["plan"]["rates"][0]["modes"]["disaggregated"]
    pre = [g for g in m["workers"] if g["role"] == "prefill"]
    assert pre and pre[0]["count"] > 1
    g = pre[0]
    assert g["limit_detail"].startswith(f"at {g['rate_per_worker_rps']:.3g} req/s")
    assert g["load_rps"] <= g["rate_per_worker_rps"] * (1 + 1e-9)
