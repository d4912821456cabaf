"""Explanations: flip thresholds re-solved on both sides, bindings and alternatives on a small instance."""
from __future__ import annotations

import pytest

from optimizer.budget import Budget
from optimizer.schema_base import read_yaml
from optimizer.supernode.explain import _placement, _with_tier, achievable, flip_thresholds
from optimizer.supernode.schema import load
from tests.supernode_helpers import report_for, small_instance, solve_for


@pytest.mark.parametrize("tier, param, slo", [("rom", "latency_per_hop_us", 50), ("host", "round_trip_us", 10),
                                              ("pool", "round_trip_us", 50)])
def test_flip_threshold_changes_the_tier(tmp_path, tier, param, slo):
    path = small_instance(tmp_path, table_tiers=[tier, "hbm"], slo_ms_per_token=slo)
    p = load(read_yaml(path), path, None)
    res = solve_for(p, "throughput")
    base = _placement(res)
    assert any(tier in tables for tables, _ in base)
    (th,) = [t for t in flip_thresholds(p, res, Budget.seconds(8.0)) if t["tier"] == tier]
    assert th["threshold"] is not None and th["threshold"] > th["given"]
    lo, hi = th["bracket"]
    assert hi / lo < 1.01  # bisection converged
    assert _placement(solve_for(_with_tier(p, tier, param, lo), "throughput")) == base
    after = _placement(solve_for(_with_tier(p, tier, param, hi), "throughput"))
    assert after != base
    assert all(tier not in tables for tables, _ in after) or len(after) > len(base)


def test_bindings_and_alternatives_small(tmp_path):
    path = small_instance(tmp_path, table_tiers=["hbm"], sizes=[4, 8, 16])
    p = load(read_yaml(path), path, None)
    rep = report_for(p, "throughput", thresholds=False)
    fams = {b.key.family for b in rep.binding}
    assert {"cards", "slo", "all_to_all"} <= fams
    cards = next(b for b in rep.binding if b.key.family == "cards")
    assert cards.slack == 0
    sizes = {(a["size"], a["fabric"]) for a in rep.alternatives}
    assert {(4, "scale_up"), (8, "scale_up"), (16, "cross_server")} <= sizes
    chosen = [a for a in rep.alternatives if a["why"] == "chosen"]
    assert len(chosen) == 1
    lost = [a for a in rep.alternatives if a["why"] != "chosen" and a["feasible"]]
    assert all(a["tokens_per_s_per_card"] <= chosen[0]["tokens_per_s_per_card"] + 1e-9 for a in lost)
    # a 16-card instance exceeds the 8-card NVLink domain: only the NIC-joined option exists
    assert all(a["fabric"] == "cross_server" for a in rep.alternatives if a["size"] == 16)


def test_memory_binding_when_hbm_is_short(tmp_path):
    path = small_instance(tmp_path, table_tiers=["hbm"], slo_ms_per_token=500, sizes=[4])
    raw = read_yaml(path)
    raw["supernode"]["system"]["card"]["memory_gb"] = 8
    p = load(raw, path, None)
    rep = report_for(p, "throughput", thresholds=False)
    mem = [b for b in rep.binding if b.key.family == "memory"]
    assert mem and 0 <= mem[0].slack < 4.001e-3  # less than one session's 4.001 MB of KV left
    assert "HBM capacity" in mem[0].detail


def test_best_achievable_names_an_option_that_fits_memory():
    """An impossible per-token target on DeepSeek-V3 / 64 H100: the best achievable is the
    fastest option the target alone rules out; a fresh user was pointed to S=8, which is 21 GB
    short of memory."""
    from optimizer.schema_base import apply_overrides
    from tests.conftest import INSTANCES

    path = INSTANCES / "supernode_deepseek_v3.yaml"
    p = load(apply_overrides(read_yaml(path), ["supernode.slo_ms_per_token=0.001"], path), path, None)
    res = solve_for(p, "throughput")
    a = achievable(p, res)
    assert any("memory" in r.violations for r in res.results)  # the case: some options do not fit
    fits = [r for r in res.results if set(r.violations) <= {"slo"}]
    assert fits and a["requirement"] == "slo_ms_per_token"
    assert a["best"] == pytest.approx(min(r.single.token for r in fits) * 1e3)
    named = next(r for r in res.results if f"({r.option.label(p)})" in a["detail"])
    assert "memory" not in named.violations


def test_pipeline_protocol_and_frozen_solution(tmp_path):
    """The supernode is on the one pipeline (no old ``run``); the solution is frozen and the
    families describe a conflicting key from the problem alone."""
    import dataclasses

    import optimizer.supernode as pkg
    from optimizer.problems import Pipeline
    from optimizer.supernode import PIPELINE
    from optimizer.supernode.model import family_module

    assert isinstance(PIPELINE, Pipeline) and not hasattr(pkg, "run")
    path = small_instance(tmp_path, table_tiers=["hbm"], sizes=[4])
    p = PIPELINE.load(read_yaml(path), path)
    sol = PIPELINE.solve(p, Budget.unlimited())
    with pytest.raises(dataclasses.FrozenInstanceError):
        sol.plan = None
    assert PIPELINE.evaluate(p, sol.plan) == sol.evaluation
    cards = next(k for k in PIPELINE.build(p).named.keys if k.family == "cards")
    assert family_module(cards.family).describe(cards, p) == f"{p.cards} cards given"
