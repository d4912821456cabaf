"""Serving properties (hypothesis) on random small Llama-3.1-8B instances, analytic plans (no
simulation): a higher rate never needs fewer GPUs, a looser SLO never more, 2R at most twice R;
the MILP optimum equals a brute-force enumeration of worker counts."""
from __future__ import annotations

import itertools
import math
from functools import lru_cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objectives.serving import registry
from optimizer.serving.perf import ServingModel
from optimizer.serving.solve import MODE_ROLES, solve_mode
from tests.serving_helpers import llama8b_raw, problem

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GPUS = registry()["gpus"]


@lru_cache(maxsize=64)
def _workers(isl, osl, ttft, tpot, servers):
    p = problem(llama8b_raw(1.0, isl, osl, ttft, tpot, servers))
    return p, ServingModel(p).workers()


def _gpus(isl, osl, ttft, tpot, rate, mode, servers=2):
    p, ws = _workers(isl, osl, ttft, tpot, servers)
    res = solve_mode(p, ws, mode, GPUS, rate)
    return math.inf if res.counts is None else res.value


lengths = st.tuples(st.sampled_from([128, 512, 2048, 8192]), st.sampled_from([32, 128, 512]))
slos = st.tuples(st.sampled_from([300.0, 1000.0, 3000.0]), st.sampled_from([10.0, 20.0, 40.0]))
modes = st.sampled_from(["aggregated", "disaggregated"])


@SETTINGS
@given(lengths, slos, modes, st.floats(0.5, 30), st.floats(1.0, 3.0))
def test_higher_rate_never_needs_fewer_gpus(ln, slo, mode, rate, factor):
    assert _gpus(*ln, *slo, rate * factor, mode) >= _gpus(*ln, *slo, rate, mode)


@SETTINGS
@given(lengths, slos, modes, st.floats(0.5, 30), st.sampled_from([1.5, 2.0, 4.0]))
def test_looser_slo_never_needs_more_gpus(ln, slo, mode, rate, looser):
    tight = _gpus(*ln, *slo, rate, mode)
    assert _gpus(*ln, slo[0] * looser, slo[1], rate, mode) <= tight
    assert _gpus(*ln, slo[0], slo[1] * looser, rate, mode) <= tight


@SETTINGS
@given(lengths, slos, modes, st.floats(0.5, 20))
def test_double_rate_at_most_double_gpus(ln, slo, mode, rate):
    one = _gpus(*ln, *slo, rate, mode, servers=8)
    two = _gpus(*ln, *slo, 2 * rate, mode, servers=8)
    if math.isfinite(one):
        assert two <= 2 * one


@SETTINGS
@given(lengths, slos, modes, st.floats(0.5, 40))
def test_milp_matches_brute_force(ln, slo, mode, rate):
    """Enumerate every count vector of each role (each configuration 0..16/g workers); the roles
    share only the 16 GPUs and the objective is their sum, so the optimum is the sum of each role's
    fewest GPUs carrying the rate, feasible when it fits the 16. A configuration's n workers carry
    ``Worker.capacity(n)`` (pooled prefill queues; ``rate·n`` otherwise)."""
    p, ws = _workers(*ln, *slo, 2)
    res = solve_mode(p, ws, mode, GPUS, rate)
    total = 0
    for role in MODE_ROLES[mode]:
        usable = [w for w in ws if w.role == role and w.rate > 0]
        best = math.inf
        for counts in itertools.product(*[range(0, 16 // w.gpus + 1) for w in usable]):
            gpus = sum(n * w.gpus for n, w in zip(counts, usable))
            if gpus < best and sum(counts) >= 1 and sum(w.capacity(n) for n, w in zip(counts, usable)) >= rate - 1e-9:
                best = gpus
        total += best
    want = total if total <= 16 else math.inf
    assert (res.value if res.counts is not None else math.inf) == want
