"""Queueing formulas (golden values) and the rule that no plan below the simulated attainment is returned."""
from __future__ import annotations

import dataclasses
import math

import pytest

import optimizer.serving as serving
from optimizer.serving.perf import erlang_c, poisson_quantile, wait_quantile_s
from tests.serving_helpers import llama70b_raw, problem


def test_erlang_c_golden_values():
    assert erlang_c(1, 0.7) == pytest.approx(0.7)            # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)          # M/M/2, a = 1: 1/3
    # M/M/3, a = 2: B(3,2) = (8/6)/(1+2+2+8/6) = 4/19; C = 3B/(3 - 2(1-B)) = 12/27 = 0.4444
    assert erlang_c(3, 2.0) == pytest.approx(4 / 9)


def test_wait_quantile_is_the_mm1_tail():
    """M/M/1 (cs² = 1): P(W > t) = rho·exp(-(mu - lambda)·t), so the q-quantile is ln(rho/(1-q))/(mu - lambda)."""
    lam, s = 0.8, 1.0
    assert wait_quantile_s(lam, s, 1.0, 1, 0.95) == pytest.approx(math.log(0.8 / 0.05) / 0.2)
    assert wait_quantile_s(lam, s, 1.0, 1, 0.1) == 0.0          # P(wait) = 0.8 <= 0.9: no wait at the 10% quantile
    assert wait_quantile_s(1.0, s, 1.0, 1, 0.95) == math.inf      # saturated
    # deterministic service (cs² = 0) halves the M/M/1 wait (Pollaczek-Khinchine / Allen-Cunneen)
    assert wait_quantile_s(lam, s, 0.0, 1, 0.95) == pytest.approx(0.5 * math.log(0.8 / 0.05) / 0.2)


def test_poisson_quantile():
    assert poisson_quantile(0.0, 0.95) == 0
    assert poisson_quantile(0.05, 0.95) == 0                     # e^-0.05 = 0.951
    assert poisson_quantile(0.06, 0.95) == 1
    assert poisson_quantile(3.0, 0.95) == 6                      # CDF(5) = 0.916, CDF(6) = 0.966


def _low_attainment(real, fail_calls):
    calls = {"n": 0}

    def fake(*args, **kw):
        calls["n"] += 1
        out = real(*args, **kw)
        return dataclasses.replace(out, attainment=0.0) if calls["n"] <= fail_calls else out

    return fake, calls


def test_a_plan_below_the_attainment_is_resolved_with_more_capacity(monkeypatch):
    raw = llama70b_raw(mode="aggregated", simulation={"requests": 300})
    p = problem(raw)
    base = serving.solve_instance(p).to_dict()
    fake, calls = _low_attainment(serving.simulate, 1)
    monkeypatch.setattr(serving, "simulate", fake)
    d = serving.solve_instance(p).to_dict()
    m = d["plan"]["rates"][0]["modes"]["aggregated"]
    # the miss (attainment 0, shortfall 0.9) doubles the capacity asked; the plan passes there, then
    # the bisection between 1x and 2x keeps the cheapest passing plan it simulates
    assert calls["n"] >= 2 and 1.0 < m["capacity_margin"] <= 2.0
    assert m["capacity_margin_by_role"] == {"aggregated": m["capacity_margin"]}
    assert d["status"] == "feasible"                             # optimal only for the inflated rate
    cap = sum(g["rate_per_worker_rps"] * g["count"] for g in m["workers"])
    assert cap >= m["capacity_margin"] * 10 - 1e-9
    assert m["gpus"] >= base["plan"]["rates"][0]["modes"]["aggregated"]["gpus"]


def test_no_plan_is_returned_when_the_simulation_always_misses(monkeypatch):
    raw = llama70b_raw(mode="aggregated", simulation={"requests": 200})
    fake, _ = _low_attainment(serving.simulate, 10 ** 6)
    monkeypatch.setattr(serving, "simulate", fake)
    d = serving.solve_instance(problem(raw)).to_dict()
    assert d["status"] == "infeasible" and d["plan"] is None
    assert any(c.startswith("simulation[aggregated") for x in d["conflicts"] for c in x["constraints"])


def test_a_deadline_far_away_simulates_exactly_as_without_one():
    """The sliced run under a wall-clock deadline processes the same events in the same order."""
    import time

    from optimizer.serving.simulate import simulate

    p = problem(llama70b_raw(mode="both", simulation={"requests": 400}))
    rep = serving.solve_instance(p, simulate_plans=False)
    for m in rep.results[0].plans.values():
        a = simulate(p, rep.workers, m.result.counts, m.mode, m.rate)
        b = simulate(p, rep.workers, m.result.counts, m.mode, m.rate, deadline=time.perf_counter() + 600)
        assert a.to_dict() == b.to_dict()


def test_the_time_limit_cuts_a_long_simulation_and_says_so():
    """A fresh user's 200,000 simulated requests ran 17-20 s on --time-limit 5: now the
    simulations stop at the limit and the plans carry the analytic checks only, named in the
    result (the call's wall time against the limit: benchmarks/bench_serving.py --limits)."""
    import time

    from optimizer.budget import Budget

    raw = llama70b_raw(mode="both", simulation={"requests": 200_000})
    d = serving.solve_instance(problem(raw), Budget.for_command(3.0, started=time.perf_counter())).to_dict()
    modes = d["plan"]["rates"][0]["modes"]
    assert all(m["simulation_cut_short"] and m["simulated"] is None for m in modes.values())
    assert d["status"] == "optimal" and d["plan"]["best_mode"] == "aggregated"
    assert len(d["solver"]["cut_short"]) == 2 and "analytic model only" in d["notes"][-1]
    # without a limit nothing is cut
    d = serving.solve_instance(problem(llama70b_raw(mode="both", simulation={"requests": 300}))).to_dict()
    assert d["solver"]["cut_short"] == [] and all(m["simulation_cut_short"] is None
                                                   for m in d["plan"]["rates"][0]["modes"].values())
