"""The serving pipeline: rows named by their constraint keys, the progress rows, frozen solutions."""
from __future__ import annotations

import dataclasses

import pytest

from constraints.serving import capacity, deploy, gpus
from optimizer.budget import Budget
from optimizer.problems import Pipeline
from optimizer.serving import PIPELINE
from tests.serving_helpers import llama8b_raw, problem


def test_the_serving_package_follows_the_pipeline_protocol():
    assert isinstance(PIPELINE, Pipeline)


def test_every_row_of_the_milp_is_named_by_its_constraint_key():
    """The MILP's rows in HiGHS carry the keys' names, one row per role and per pool."""
    p = problem(llama8b_raw(rate=2.0, isl=1000, osl=200, ttft_ms=1000, tpot_ms=50, servers=2, mode="both"))
    milps = PIPELINE.build(p)
    assert set(milps) == {"aggregated", "disaggregated"}
    for mode, m in milps.items():
        names = list(m.h.getLp().row_names_)
        roles = ("aggregated",) if mode == "aggregated" else ("prefill", "decode")
        want = [str(capacity.key(r)) for r in roles] + [str(deploy.key(r)) for r in roles] + \
               [str(gpus.key(pool.name)) for pool in p.pools]
        # prefill configurations with a pooling gain first: their segments and count links
        pooled = [n for n in names if n.startswith("pooling[")]
        assert (mode == "disaggregated") == bool(pooled)
        assert names[len(pooled):] == want and list(m.rows)[len(pooled):] == want
        assert all(n.endswith(("low]", "high]", "one segment]")) or n.startswith("pooling[prefill ") for n in pooled)
        assert all(str(k) == n for n, k in m.rows.items())


def test_describe_gives_each_row_in_words():
    from optimizer.serving.solve import mode_data
    from optimizer.serving.perf import ServingModel

    p = problem(llama8b_raw(rate=2.0, isl=1000, osl=200, ttft_ms=1000, tpot_ms=50))
    data = mode_data(p, ServingModel(p).workers(("aggregated",)), "aggregated", 2.0)
    assert capacity.describe(capacity.key("aggregated"), data) == "aggregated workers must carry 2 requests/s within the SLOs"
    pool = p.pools[0]
    assert gpus.describe(gpus.key(pool.name), data) == f"{pool.count} {pool.gpu} GPUs in the pool"


def test_the_progress_sink_gets_one_row_per_rate_and_mode():
    """``--progress`` rows for serving: elapsed time, method, value, bound and gap after each
    (rate, mode) solve, with the values the result reports."""
    raw = llama8b_raw(rate=2.0, isl=1000, osl=200, ttft_ms=1000, tpot_ms=50, mode="both")
    raw["serving"]["traffic"]["rate_rps"] = [1.0, 2.0]
    p = problem(raw)
    rows = []
    solution = PIPELINE.solve(p, Budget.unlimited(), rows.append)
    *solves, last = rows
    assert [r["method"] for r in solves] == [f"highs {m} at {rate:g} req/s" for rate in (1.0, 2.0)
                                             for m in ("aggregated", "disaggregated")]
    assert last["method"] == f"done: {solution.status.value}"  # the final row says how it ended
    assert all(set(r) == {"elapsed_s", "method", "value", "bound", "gap"} for r in rows)
    assert [r["elapsed_s"] for r in rows] == sorted(r["elapsed_s"] for r in rows)
    values = [m.result.value for rr in solution.results for m in rr.plans.values()]
    assert [r["value"] for r in solves] == values


def test_the_solution_is_frozen_and_the_report_is_built_from_it_once():
    p = problem(llama8b_raw(rate=2.0, isl=1000, osl=200, ttft_ms=1000, tpot_ms=50))
    budget = Budget.unlimited()
    solution = PIPELINE.solve(p, budget)
    with pytest.raises(dataclasses.FrozenInstanceError):
        solution.results[0].plans["aggregated"].result.value = 0.0  # type: ignore[misc]
    report = PIPELINE.report(p, solution, PIPELINE.explain(p, solution, budget))
    assert report.to_dict() is report.to_dict()
    best = solution.best(solution.results[0])
    assert report.to_dict()["objective"]["value"] == best.result.value


def test_evaluate_simulates_each_rates_best_plan_as_the_solve_checked_it():
    raw = llama8b_raw(rate=2.0, isl=1000, osl=200, ttft_ms=1000, tpot_ms=50)
    raw["serving"]["simulation"] = {"enabled": True, "requests": 300}
    p = problem(raw)
    solution = PIPELINE.solve(p, Budget.unlimited())
    best = solution.best(solution.results[0])
    (sim,) = PIPELINE.evaluate(p, solution)
    assert sim.to_dict() == best.sim.to_dict()
