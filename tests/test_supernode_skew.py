"""The supernode All-to-All under an expert-load skew (``supernode.expert_load``, issue #26 item 3):
cards' shares from a routing trace, the busiest link of the skewed dispatch and combine on every
kind of domain (candidate fabrics, the NVLink domain, NIC-joined servers), hand-computed figures,
the independent evaluator's closed forms against the fabric model, a uniform trace changing
nothing, real ESFT traces (skipped when ../shared/data is absent) and bad input."""
from __future__ import annotations

import copy
import dataclasses
import json
import random

import numpy as np
import pytest

from optimizer.schema_base import read_yaml
from optimizer.supernode import PIPELINE
from optimizer.supernode.evaluate import card_shares as scalar_card_shares
from optimizer.supernode.evaluate import fabric_check
from optimizer.supernode.expert_load import ExpertLoad
from optimizer.supernode.perf import CROSS_SERVER, SCALE_UP, a2a_time, evaluate_all
from optimizer.supernode.schema import load
from tests.conftest import SHARED_DATA
from tests.supernode_helpers import REPO, SMALL_INVENTORY, SMALL_SYSTEM, report_for, run_cli, small_instance, solve_for

I64 = REPO / "instances" / "supernode_fabric_64.yaml"
I512 = REPO / "instances" / "supernode_fabric_512.yaml"
SYNTHETIC = "traces/synthetic_v3_ep32.json"  # 256 experts, 4 layers (instances/traces/README.md)
ESFT = SHARED_DATA / "expert_load" / "esft"
needs_config = pytest.mark.skipif(not (REPO / "instances" / "models" / "deepseek-v3.json").exists(),
                                  reason="DeepSeek-V3 config absent")


def _load(fractions) -> ExpertLoad:
    f = np.asarray(fractions, dtype=float)
    f = f / f.sum(axis=1, keepdims=True)
    return ExpertLoad("t", "matrix", 1, tuple(str(i) for i in range(len(f))), f.shape[1],
                      tuple(tuple(float(x) for x in row) for row in f))


def _with_skew(path, expert_load, objective="cost", **supernode):
    raw = read_yaml(path)
    raw["supernode"]["expert_load"] = expert_load
    raw["supernode"].update(supernode)
    return load(raw, path, objective)


# ------------------------------------------------------------------ cards' shares

@pytest.mark.parametrize("experts, cards", [(8, 4), (4, 8), (6, 4), (5, 7), (256, 64), (64, 512), (3, 3)])
def test_card_shares_by_interval_overlap(experts, cards):
    rng = np.random.default_rng(experts * 100 + cards)
    load_ = _load(rng.random((3, experts)) + 0.01)
    got = load_.card_shares(cards)
    assert got.shape == (3, cards)
    assert np.allclose(got.sum(axis=1), 1.0, rtol=1e-12)
    assert np.allclose(got, scalar_card_shares(load_, cards), rtol=1e-12, atol=1e-15)
    f = np.asarray(load_.fractions)
    if experts % cards == 0:  # a card takes its experts' fractions
        assert np.allclose(got, f.reshape(3, cards, experts // cards).sum(axis=2), rtol=1e-12)
    if cards % experts == 0:  # an expert's tokens split evenly over its cards
        assert np.allclose(got, np.repeat(f / (cards // experts), cards // experts, axis=1), rtol=1e-12)


def test_even_load_gives_every_card_one_share():
    assert np.allclose(_load(np.ones((2, 7))).card_shares(5), 0.2, rtol=1e-12)
    assert _load(np.ones((1, 16))).busiest_card_ratio(8) == pytest.approx(1.0)
    assert _load([[4, 2, 2, 2]]).busiest_card_ratio(4) == pytest.approx(1.6)


# ------------------------------------------------------------------ hand-computed figures

def _small(tmp_path, counts, **supernode):
    (tmp_path / "load.json").write_text(json.dumps(counts))
    path = small_instance(tmp_path, expert_load={"trace": "load.json", "format": "matrix"}, **supernode)
    return load(read_yaml(path), path, "throughput")


def test_nvlink_domain_of_four_cards_hand_figures(tmp_path):
    """Shares 0.4, 0.2, 0.2, 0.2: card 0's port receives 3 x 0.4 = 1.2 of a card's tokens (uniform:
    0.75 out of every port), so T_A2A = alpha + 1.2 x N d / B."""
    p = _small(tmp_path, [[[40, 20, 20, 20]]], cards=4, sizes=[4], allow_cross_server=False, table_tiers=["hbm"])
    (opt,) = [r.option for r in evaluate_all(p) if r.option.fabric == SCALE_UP]
    d, hw = p.inventory.dispatch_bytes_per_token, p.hw
    for n in (1.0, 37.0):
        assert float(a2a_time(p, opt, n)) == pytest.approx(hw.nvlink_latency_s + 1.2 * n * d / hw.nvlink_bandwidth,
                                                           rel=1e-12)
        uniform = dataclasses.replace(p, expert_load=None)
        assert float(a2a_time(uniform, opt, n)) == pytest.approx(hw.nvlink_latency_s + 0.75 * n * d / hw.nvlink_bandwidth,
                                                                 rel=1e-12)


def test_nic_joined_servers_hand_figures(tmp_path):
    """8 cards on two servers of 4, one hot card 0 (share 0.3, the others 0.1): NVLink out of a
    cold card of server 0 is 0.5, into card 0 3 x 0.3 = 0.9; NIC out of a card of server 1 0.6,
    into card 0 4 x 0.3 = 1.2 (uniform: 3/8 and 4/8)."""
    p = _small(tmp_path, [[[3, 1, 1, 1, 1, 1, 1, 1]]], cards=8, sizes=[8], allow_cross_server=True, table_tiers=["hbm"])
    (opt,) = {r.option for r in evaluate_all(p) if r.option.fabric == CROSS_SERVER and r.option.tables == ("hbm",)}
    hw, d = p.hw, p.inventory.dispatch_bytes_per_token
    b = 10 * d
    want = max(hw.nvlink_latency_s + b * 0.9 / hw.nvlink_bandwidth, hw.nic_latency_s + b * 1.2 / hw.nic_bandwidth)
    assert float(a2a_time(p, opt, 10.0)) == pytest.approx(want, rel=1e-12)


def test_a_uniform_trace_changes_nothing(tmp_path):
    """Equal expert counts: every option's sessions, step and All-to-All equal the run without
    a skew, on the NVLink domain, NIC-joined servers and candidate fabrics."""
    p = _small(tmp_path, [[[5] * 16, [7] * 16]], cards=16, sizes=[4, 8, 16], allow_cross_server=True)
    base = dataclasses.replace(p, expert_load=None)
    for a, b in zip(evaluate_all(p), evaluate_all(base)):
        assert a.sessions_per_card == b.sessions_per_card and a.violations == b.violations
        if a.figures is not None:
            assert a.figures.step == pytest.approx(b.figures.step, rel=1e-12)
            assert a.figures.t_a2a == pytest.approx(b.figures.t_a2a, rel=1e-12)


@needs_config
def test_a_uniform_trace_changes_no_fabric_figure(tmp_path):
    (tmp_path / "even.json").write_text(json.dumps([[100] * 256, [3] * 256]))
    raw = read_yaml(I64)
    raw["supernode"]["fabric"].pop("candidates")
    raw["supernode"]["expert_load"] = {"trace": str(tmp_path / "even.json")}
    p = load(raw, I64, "cost")
    base = dataclasses.replace(p, expert_load=None)
    for a, b in zip(evaluate_all(p), evaluate_all(base)):
        assert a.sessions_per_card == b.sessions_per_card, a.option.label(p)
        if a.fabric is not None and "fabric_ports" not in a.violations:
            assert a.fabric.a2a_s_per_byte == pytest.approx(b.fabric.a2a_s_per_byte, rel=1e-12), a.option.label(p)


# ------------------------------------------------------------------ instances, closed forms

@needs_config
@pytest.mark.parametrize("path, generated", [(I64, False), (I64, True), (I512, False)], ids=["64", "64-gen", "512"])
def test_evaluator_closed_forms_match_the_fabric_model_under_skew(path, generated):
    raw = read_yaml(path)
    raw["supernode"]["expert_load"] = {"trace": SYNTHETIC}
    if generated:
        raw["supernode"]["fabric"].pop("candidates")
    p = load(raw, path, "throughput")
    for r in evaluate_all(p):
        c = p.fabric.candidates[r.option.candidate]
        fc = fabric_check(p, c, r.option.size)
        if not fc["buildable"]:
            continue
        assert fc["per_byte"] == pytest.approx(r.fabric.a2a_s_per_byte, rel=1e-9), c.label
        assert fc["per_byte_uniform"] == pytest.approx(r.fabric.a2a_s_per_byte_uniform, rel=1e-9), c.label
        if c.kind == "switched":  # a card port takes (S-1) x its share >= (S-1)/S: never faster than uniform
            assert r.fabric.a2a_s_per_byte >= r.fabric.a2a_s_per_byte_uniform * (1 - 1e-12), c.label


@needs_config
def test_skew_of_the_synthetic_trace_moves_64_cards_off_the_torus():
    """Without skew the 8x8 torus is cheapest (every fabric holds 175 sessions per card); the
    synthetic trace's hot cards load the tori's links (162 and 166 sessions per card < 175), so
    the cheapest fabric that holds the target is the one-level switch, whose card ports take it."""
    rep = report_for(_with_skew(I64, {"trace": SYNTHETIC}), thresholds=False)
    (b,) = rep.solution.plan.instances
    assert rep.problem.fabric.candidates[b.option.candidate].label == "switched 1 level pairwise"
    alts = {a["option"].split(",")[0]: a for a in rep.alternatives}
    for fab in ("torus 8x8 pairwise", "torus 4x4x4 pairwise"):
        assert alts[f"S=64 {fab}"]["sessions_per_card"] < 175
        assert alts[f"S=64 {fab}"]["why_short"].startswith("torus links")
    d = rep.to_dict()["plan"]
    e = d["expert_load"]
    assert (e["layers"], e["experts"], e["windows"], e["format"]) == (4, 256, 3, "vllm")
    (built,) = e["built"].values()
    assert built["busiest_card_share_x_uniform"] > 1.5
    binding = {x["constraint"]: x["detail"] for x in rep.to_dict()["binding"]}
    assert "expert-load skew: busiest card" in binding["all_to_all[S=64 switched 1 level pairwise, tables -, KV hbm]"]


def random_skew_instance(tmp_path, seed):
    """NVLink and NIC-joined options (no fabric section) under a random matrix trace."""
    rnd = random.Random(seed)
    inv = copy.deepcopy(SMALL_INVENTORY)
    inv["dispatch_bytes_per_token"] = rnd.choice([65536, 1_000_000, 4_000_000])
    system = copy.deepcopy(SMALL_SYSTEM)
    system["server_cards"] = rnd.choice([2, 4])
    system["scale_out"]["bandwidth_gb_s"] = rnd.choice([5, 50])
    experts = rnd.choice([4, 16, 48])
    counts = [[[int(rnd.lognormvariate(0, 1.5) * 50) + rnd.choice([0, 1]) for _ in range(experts)]
               for _ in range(rnd.randint(1, 4))]]
    for layer in counts[0]:
        layer[0] += 1  # no empty layer
    (tmp_path / "load.json").write_text(json.dumps(counts))
    return small_instance(tmp_path, inventory=inv, system=system, cards=16, sizes=sorted(rnd.sample([2, 4, 8, 16], 2)),
                          allow_cross_server=True, slo_ms_per_token=rnd.choice([5, 20, 50]), table_tiers=["hbm", "host"],
                          expert_load={"trace": "load.json", "format": "matrix"})


@pytest.mark.parametrize("seed", range(10))
def test_evaluator_recomputes_the_skewed_step_of_nvlink_and_nic_options(tmp_path, seed):
    path = random_skew_instance(tmp_path, seed)
    p = load(read_yaml(path), path, "throughput")
    res = solve_for(p)
    ev = PIPELINE.evaluate(p, res.plan)
    assert ev.violations == []
    for b in res.plan.instances:
        (chk,) = [i for i in ev.instances if i.size == b.option.size and i.sessions_per_card == b.sessions_per_card][:1]
        assert chk.step == pytest.approx(res.results[b.index].figures.step, rel=1e-9)
        assert chk.single_user == pytest.approx(res.results[b.index].single.token, rel=1e-9)


# ------------------------------------------------------------------ real traces

@needs_config
@pytest.mark.skipif(not ESFT.exists(), reason="needs ../shared/data/expert_load/esft")
@pytest.mark.parametrize("task", ["intent", "law"])
def test_esft_routing_records_skew_the_all_to_all(task):
    """DeepSeek ESFT (64 experts, top-6, 26 layers) mapped onto the 64 cards: every card one
    expert; the busiest card takes more than the uniform 1/64, the one-level switch's All-to-All
    is slower than uniform, and the run is checked by the evaluator."""
    p = _with_skew(I64, {"trace": str(ESFT / task), "format": "topk", "num_experts": 64})
    e = p.expert_load
    assert (e.layers, e.experts) == (26, 64)
    assert e.busiest_card_ratio(64) > 1.2
    rep = report_for(p, thresholds=False)
    assert rep.status.value == "optimal" and rep.evaluation.violations == []
    one = [r for r in rep.solution.results if p.fabric.candidates[r.option.candidate].label == "switched 1 level pairwise"]
    assert one[0].fabric.a2a_s_per_byte > one[0].fabric.a2a_s_per_byte_uniform


# ------------------------------------------------------------------ input

def test_a_missing_trace_is_one_line_exit_2(tmp_path):
    path = small_instance(tmp_path, expert_load={"trace": "nope.json"})
    code, _out, err = run_cli(path)
    lines = [x for x in err.strip().splitlines() if x]
    assert code == 2 and len(lines) == 1 and "supernode.expert_load.trace" in lines[0] and "not found" in lines[0], err


def test_a_layer_without_tokens_is_bad_input(tmp_path):
    (tmp_path / "load.json").write_text(json.dumps([[[1, 2, 3, 4], [0, 0, 0, 0]]]))
    path = small_instance(tmp_path, expert_load={"trace": "load.json", "format": "matrix"})
    code, _out, err = run_cli(path)
    assert code == 2 and "supernode.expert_load.trace" in err and "layer 1 routes no token" in err, err


def test_a_dense_model_has_no_all_to_all_to_skew(tmp_path):
    inv = copy.deepcopy(SMALL_INVENTORY)
    inv["experts"] = {"routed": 0, "per_token": 0, "expert_bytes": 0, "routed_bytes": 0}
    (tmp_path / "load.json").write_text(json.dumps([[1, 2]]))
    path = small_instance(tmp_path, inventory=inv, expert_load={"trace": "load.json"})
    code, _out, err = run_cli(path)
    assert code == 2 and "supernode.expert_load" in err and "no routed experts" in err, err
