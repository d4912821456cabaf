"""Acceptance: the reference chapter's section 6.7.4 (DeepSeek-V4.1-Flash, 200K decode on 256 H100).

Tolerances: figures the chapter prints to 3 significant digits are checked to half a unit of
the last printed digit (71.0 GB -> +-0.05 GB, 14.1 ms -> +-0.05 ms); integer figures exactly
(37 and 335 sessions; 2,632 and 19,420 tokens/s per card rounded to the unit).
The batch-1 token (2.76 ms, 362 tokens/s) and the first block's window (69 us) likewise, to half a
unit of the last printed digit; eq 6-15 counts one All-to-All exchange per MoE layer at batch 1,
as the chapter does (``single_user_all_to_all_per_moe_layer: 1``, the default; 2 gives 2.80 ms).
"""
from __future__ import annotations

import pytest

from optimizer.schema_base import read_yaml
from optimizer.supernode.perf import SCALE_UP, Option, evaluate_option, figures, single_user
from optimizer.supernode.schema import GB, load, pool_bandwidth, pool_in_flight_needed
from tests.conftest import shared
from tests.supernode_helpers import CHAPTER, report_for, run_json

INVENTORY = ("models", "deepseek-ai--DeepSeek-V4.1-Flash.inventory.yaml")


@pytest.fixture(scope="module")
def chapter():
    shared(*INVENTORY)
    return load(read_yaml(CHAPTER), CHAPTER, None)


@pytest.fixture(scope="module")
def report(chapter):
    return report_for(chapter, "throughput", thresholds=False)


def _hbm(p, size):
    return evaluate_option(p, Option(size, SCALE_UP, tuple("hbm" for _ in p.inventory.tables), "hbm"))


@pytest.mark.parametrize("size, weights_gb, sessions, step_ms, tokens", [
    (8, 71.0, 37, 14.1, 2632),
    (64, 17.2, 335, 17.3, 19420),
])
def test_chapter_sizes(chapter, size, weights_gb, sessions, step_ms, tokens):
    r = _hbm(chapter, size)
    assert r.weights_per_card / GB == pytest.approx(weights_gb, abs=0.05)
    assert r.sessions_per_card == sessions
    assert r.limit == "memory"
    assert r.figures.step * 1e3 == pytest.approx(step_ms, abs=0.05)
    assert round(r.figures.tokens_per_s_card) == tokens


def test_solver_picks_64_and_names_hbm_for_8(report):
    assert report.status.value == "optimal"
    plan = report.to_dict()["plan"]
    assert [(i["size"], i["count"]) for i in plan["instances"]] == [(64, 4)]
    assert round(plan["tokens_per_s_per_card"]) == 19420
    alt8 = [a for a in report.alternatives if a["size"] == 8]
    assert alt8 and alt8[0]["limited_by"] == "HBM capacity"
    assert "HBM capacity" in alt8[0]["limit_detail"]
    assert "2,632 tokens/s per card against 19,420" in alt8[0]["why"]
    others = {a["size"]: a for a in report.alternatives}
    assert others[128]["tokens_per_s_per_card"] < 19420 and others[256]["tokens_per_s_per_card"] < 19420
    assert report.solution.bound == pytest.approx(report.solution.value)


@pytest.mark.parametrize("size", [8, 64, 128, 256])
def test_batch1_every_size(chapter, size):
    s = single_user(chapter, Option(size, SCALE_UP, ("hbm", "hbm"), "hbm"))
    assert chapter.inventory.replicated_read_bytes / GB == pytest.approx(8.2, abs=0.05)
    # the weight stream of eq 6-15 exactly: 8.2 GB / 3,350 GB/s / 0.9
    assert s.t_weight / 0.9 * 1e3 == pytest.approx(2.722, abs=0.0005)
    assert s.token * 1e3 == pytest.approx(2.76, abs=0.005)
    assert 1 / s.token == pytest.approx(362, abs=0.5)
    assert s.window_first_block * 1e6 == pytest.approx(69, abs=0.5)


def test_engram_lookups_and_host_round_trip(chapter, report):
    inv = chapter.inventory
    per_token = sum(t.rows_per_token * t.row_bytes for t in inv.tables)
    assert sum(t.rows_per_token for t in inv.tables) == 48
    assert per_token / 1e3 == pytest.approx(12.7, abs=0.05)
    check = report.to_dict()["plan"]["tiers"]["prefetch_check"]
    assert chapter.hw.tiers["host"].latency_s == pytest.approx(1.05e-6)
    assert check["host"]["fits"] and check["host"]["fetch_us"] >= 1.05
    assert check["host"]["window_us"] == pytest.approx(69, abs=0.5)


def test_memory_pool_eq_6_12():
    assert pool_bandwidth(50e9, 128, 256, 7.52e-6) / 1e9 == pytest.approx(4.36, abs=0.005)
    assert pool_in_flight_needed(50e9, 256, 7.52e-6) == 1469
    assert 4096 * 256 / 7.52e-6 / 1e9 == pytest.approx(139, abs=0.5)
    assert pool_bandwidth(50e9, 4096, 256, 7.52e-6) == 50e9  # the path binds


def test_chapter_pool_figures_from_hardware_file(chapter):
    pool = chapter.hw.tiers["pool"]
    assert pool.bandwidth / 1e9 == pytest.approx(4.36, abs=0.005)
    assert pool.detail["in_flight_for_path"] == 1469


def test_evaluator_agrees_with_model(chapter, report):
    ev = report.evaluation
    assert ev.violations == []
    inst = ev.instances[0]
    r = _hbm(chapter, 64)
    assert inst.step == pytest.approx(r.figures.step, rel=1e-12)
    assert inst.single_user == pytest.approx(r.single.token, rel=1e-12)
    assert ev.tokens_per_s_per_card == pytest.approx(report.solution.value, rel=1e-6)


def test_other_objectives(chapter):
    s = report_for(chapter, "sessions", thresholds=False)
    assert [(i["size"], i["count"]) for i in s.to_dict()["plan"]["instances"]] == [(256, 1)]
    assert s.solution.value == 256 * _hbm(chapter, 256).sessions_per_card
    import dataclasses
    c = report_for(dataclasses.replace(chapter, target_sessions=20000), "cards", thresholds=False)
    # 64 x 335 = 21,440 >= 20,000 on one 64-card instance; no smaller size holds that many
    assert c.solution.value == 64
    u = report_for(chapter, "single_user", thresholds=False)
    assert u.solution.value == pytest.approx(min(_hbm(chapter, S).single.token for S in (8, 64, 128, 256)) * 1e3,
                                           abs=1e-5)


def test_step_grows_with_size_at_fixed_batch(chapter):
    """More cards per instance: less weight per card but a longer All-to-All at the same batch."""
    a = figures(chapter, Option(64, SCALE_UP, ("hbm", "hbm"), "hbm"), 100)
    b = figures(chapter, Option(256, SCALE_UP, ("hbm", "hbm"), "hbm"), 100)
    assert b.t_a2a > a.t_a2a and b.weights_per_card < a.weights_per_card


def test_cli_json_envelope(chapter):
    code, d = run_json(CHAPTER)
    assert code == 0
    assert set(d) >= {"problem", "name", "status", "objective", "plan", "binding", "alternatives", "conflicts",
                      "definitions", "solver"}
    assert d["problem"] == "supernode"
    assert set(d["objective"]) >= {"name", "value", "unit", "bound", "gap"}
    assert set(d["solver"]) >= {"name", "status", "time_s", "gap"}
    assert any(b["family"] == "memory" for b in d["binding"])
    assert d["conflicts"] == []
    assert "step_ms" in d["definitions"]


def test_rom_per_hop_flip_threshold_matches_window():
    """Exercise 6-11(f) on the tiers variant: the Engram table of layer 1 leaves ROM when
    hops x per-hop latency + rows / B_ROM exceeds its window (one block of the step)."""
    from tests.supernode_helpers import REPO

    shared(*INVENTORY)
    path = REPO / "instances" / "supernode_v41_flash_tiers.yaml"
    p = load(read_yaml(path), path, None)
    rep = report_for(p, "throughput")
    (inst,) = rep.to_dict()["plan"]["instances"]
    assert inst["size"] == 64 and set(inst["tables"].values()) == {"rom"}
    rom = p.hw.tiers["rom"]
    n = inst["sessions_per_card"]
    rows_bytes = n * sum(t.rows_per_token * t.row_bytes for t in p.inventory.tables)
    window = inst["step_ms"] * 1e-3 / p.inventory.layers
    expect_us = (window - rows_bytes / rom.bandwidth) / rom.detail["hops"] * 1e6
    (th,) = [t for t in rep.thresholds if t["tier"] == "rom"]
    assert th["threshold"] == pytest.approx(expect_us, rel=0.005)
    assert "tables rom,host" in th["detail"]  # the layer-14 table keeps its longer window in ROM


def test_batch1_counting_dispatch_and_combine_separately(chapter):
    """With two exchanges per MoE layer at batch 1 (as the batch step counts them) the token takes
    2.722 + 2 x 40 x (0.822 us + 61,440 B / 450 GB/s) = 2.80 ms."""
    from dataclasses import replace

    p = replace(chapter, single_user_a2a=2)
    s = single_user(p, Option(64, SCALE_UP, ("hbm", "hbm"), "hbm"))
    expect = 8.2078775e9 / 3350e9 / 0.9 + 2 * 40 * (0.822e-6 + 61440 * 63 / 64 / 450e9)
    assert s.token == pytest.approx(expect, rel=2e-3)
    assert s.token * 1e3 == pytest.approx(2.80, abs=0.005)
