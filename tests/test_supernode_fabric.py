"""The supernode problem decides the fabric (issue #26 item 3): golden figures of the 64- and
512-card instances (chapter 6.5 / 6.5.5 figures that involve the decision), the independent
closed forms against the fabric model, bad input, and an exhaustive check on random small
instances that the solver's fabric and plan are the best over every enumerated candidate."""
from __future__ import annotations

import copy
import math
import random
from pathlib import Path

import pytest
import yaml

from optimizer.schema_base import read_yaml
from optimizer.supernode import PIPELINE
from optimizer.supernode.evaluate import fabric_check
from optimizer.supernode.perf import FABRIC, evaluate_all
from optimizer.supernode.schema import load
from tests.supernode_helpers import REPO, SMALL_INVENTORY, SMALL_SYSTEM, report_for, run_cli, small_instance, solve_for

I64 = REPO / "instances" / "supernode_fabric_64.yaml"
I512 = REPO / "instances" / "supernode_fabric_512.yaml"
needs_config = pytest.mark.skipif(not (REPO / "instances" / "models" / "deepseek-v3.json").exists(),
                                  reason="DeepSeek-V3 config absent")


def _load(path: Path, objective: str | None = None, **changes):
    raw = read_yaml(path)
    for k, v in changes.items():
        raw["supernode"]["fabric" if k == "fabric" else k] = v
    return load(raw, path, objective)


def _chosen(report) -> dict:
    d = report.to_dict()
    (inst,) = d["plan"]["instances"]
    return inst


@needs_config
def test_64_cards_the_cheapest_fabric_is_a_torus_and_pairwise_fits_8_hosts():
    rep = report_for(_load(I64, "cost"), thresholds=False)
    inst = _chosen(rep)
    assert rep.status.value == "optimal"
    assert inst["fabric"] == "torus 8x8 pairwise"
    f = inst["fabric_figures"]
    assert (f["port_links"], f["switch_chips"], f["max_hops"], f["hosts"]) == (512, 0, 8, 8)
    # pairwise state for 8 hosts of A = 8 endpoints: 512 x 64 x 7 + 256 B = 224.25 KiB of 256 KiB
    assert f["connection_state_kib"] == pytest.approx(224.25)
    assert f["connection_state_max_hosts"] == 8
    alts = {a["option"].split(",")[0]: a for a in rep.alternatives}
    t = alts["S=64 torus 4x4x4 pairwise"]["fabric_figures"]
    # the chapter's 4x4x4 torus: 192 links (here each bundles 3 of the H100's 18 NVLink4 ports), farthest pair 6 hops
    assert (t["links"], t["port_links"], t["switch_chips"], t["max_hops"]) == (192, 576, 0, 6)
    s = alts["S=64 switched 1 level pairwise"]["fabric_figures"]
    assert (s["port_links"], s["switch_chips"], s["max_hops"]) == (1152, 18, 2)
    bill = rep.to_dict()["plan"]["fabric_bill"]
    assert bill == {"switch_chips": 0, "port_links": 512, "power_kw": pytest.approx(1.024), "fabric_cost_usd": 102_400,
                    "cost_usd": 1_702_400, "per_domain": [{"domains": 1, "cards": 64, "switch_chips": 0, "port_links": 512,
                                                           "power_kw": 1.024, "cost": 102_400}]}


@needs_config
def test_64_cards_six_port_fabrics_count_the_chapters_links_and_chips():
    """Chapter 6.5: 64 cards with 6 ports each: a 4x4x4 torus needs 192 links and no switch chip,
    a one-level switched fabric 384 links and six 64-port chips; 6 hops vs 2."""
    raw = read_yaml(I64)
    raw["supernode"]["fabric"]["card_ports"] = 6
    raw["supernode"]["fabric"]["candidates"] = [{"kind": "torus", "dims": [4, 4, 4]}, {"kind": "switched", "levels": 1}]
    p = load(raw, I64, "throughput")
    figs = {r.fabric.label: r.fabric for r in evaluate_all(p)}
    t, s = figs["torus 4x4x4 pairwise"], figs["switched 1 level pairwise"]
    assert (t.port_links, t.switch_chips, t.max_hops, t.max_chips) == (192, 0, 6, 5)
    assert (s.port_links, s.switch_chips, s.max_hops, s.max_chips) == (384, 6, 2, 1)


@needs_config
def test_512_cards_pairwise_overflows_so_ub_and_the_48_16_leaf_binds_the_all_to_all():
    rep = report_for(_load(I512, "cost"), thresholds=False)
    inst = _chosen(rep)
    assert rep.status.value == "optimal"
    assert inst["fabric"] == "switched 32/32 UB"
    f = inst["fabric_figures"]
    assert (f["port_links"], f["switch_chips"], f["max_hops"], f["hosts"]) == (18432, 432, 4, 64)
    assert f["busiest_link"].startswith("card")  # 32/32: 800 GB/s of uplink per plane, the card ports bind
    alts = {a["option"].split(",")[0]: a for a in rep.alternatives}
    for fab in ("torus 8x8x8", "torus 16x32", "switched 32/32", "switched 48/16"):
        why = alts[f"S=512 {fab} pairwise"]["why_short"]
        assert why == "pairwise state > 256 KiB cache beyond 8 hosts", fab
    leaf = alts["S=512 switched 48/16 UB"]
    assert leaf["fabric_figures"]["busiest_link"].startswith("leaf")
    assert leaf["why_short"] == f"leaf uplinks 400 GB/s bind: N {leaf['sessions_per_card']} < 201"
    assert "uplinks 16 x 25 = 400 GB/s per plane" in leaf["why"] and "the leaf uplink binds" in leaf["why"]
    assert alts["S=512 torus 8x8x8 UB"]["why_short"].startswith("torus links 75 GB/s bind")
    assert alts["S=512 switched 1 level UB"]["why_short"] == "cannot be built: one level of 64-port chips joins at most 64 cards"
    # cheaper fabrics lose only because they miss the target within the per-token limit
    chosen_cost = f["cost_usd"]
    for fab in ("torus 8x8x8 UB", "torus 16x32 UB", "switched 48/16 UB"):
        a = alts[f"S=512 {fab}"]
        assert a["fabric_figures"]["cost_usd"] < chosen_cost and a["sessions_per_card"] * 512 < 102_400
    binding = {b["constraint"]: b for b in rep.to_dict()["binding"]}
    assert "endpoint+channel fits up to 4,674 hosts" in binding["connection_state[S=512 switched 32/32 UB, tables -, KV hbm]"]["detail"]


@needs_config
def test_throughput_objective_picks_the_fastest_fabric_and_then_the_cheapest():
    p = _load(I64, "throughput")
    res = solve_for(p)
    (b,) = res.plan.instances
    assert p.fabric.candidates[b.option.candidate].label == "switched 1 level pairwise"
    best = max(r.tokens_per_s_instance for r in res.results if r.feasible)
    assert res.results[b.index].tokens_per_s_instance == best


@needs_config
@pytest.mark.parametrize("path", [I64, I512])
def test_closed_forms_of_the_evaluator_match_the_fabric_model(path):
    p = _load(path, "throughput")
    for r in evaluate_all(p):
        c = p.fabric.candidates[r.option.candidate]
        fc = fabric_check(p, c, r.option.size)
        assert fc["buildable"] == ("fabric_ports" not in r.violations), c.label
        assert fc["state_ok"] == ("connection_state" not in r.violations), c.label
        if not fc["buildable"]:
            continue
        fg = r.fabric
        assert (fc["links"], fc["chips"], fc["hops"]) == (fg.port_links, fg.switch_chips, fg.max_hops), c.label
        assert fc["per_byte"] == pytest.approx(fg.a2a_s_per_byte, rel=1e-9), c.label
        assert fc["latency"] == pytest.approx(fg.a2a_latency_s, rel=1e-12, abs=1e-15), c.label
        assert fc["cost"] == pytest.approx(fg.cost_usd) and fc["power"] == pytest.approx(fg.power_w)


def test_without_a_fabric_nothing_changes(tmp_path):
    """No ``fabric`` section: no candidate options, no fabric stage, no fabric keys."""
    path = small_instance(tmp_path)
    p = load(read_yaml(path), path, None)
    assert p.fabric is None
    results = evaluate_all(p)
    assert all(r.option.candidate is None and r.fabric is None for r in results)
    res = solve_for(p, results=results)
    assert [s[0] for s in res.stages] == ["throughput", "sessions", "tie-break"]


@pytest.mark.parametrize("change, field", [
    ({"switch": "nope"}, "supernode.fabric.switch"),
    ({"nic": "nope"}, "supernode.fabric.nic"),
    ({"candidates": [{"kind": "torus"}]}, "supernode.fabric.candidates"),
    ({"candidates": [{"kind": "torus", "dims": [3, 3]}]}, "supernode.sizes[0]"),
    ({"hop_latency": "chapter-6.5"}, "supernode.fabric"),  # and hop_latency_ns: give one
])
def test_bad_fabric_input_is_one_line_exit_2(tmp_path, change, field):
    fab = dict(_small_fabric(), **change)
    path = small_instance(tmp_path, cards=8, sizes=[4, 8], allow_cross_server=False, fabric=fab)
    code, out, err = run_cli(path)
    assert code == 2
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1 and field in lines[0] and str(path) in lines[0], err


def test_cost_objective_needs_a_fabric(tmp_path):
    path = small_instance(tmp_path, target_sessions=10)
    code, _out, err = run_cli(path, "--objective", "cost")
    assert code == 2 and "supernode.fabric" in err


# ------------------------------------------------------------------ exhaustive check
def _small_fabric(rnd: random.Random | None = None) -> dict:
    rnd = rnd or random.Random(0)
    cands = [{"kind": "torus", "dims": [2, 2]}, {"kind": "torus", "dims": [4]}, {"kind": "torus", "dims": [2, 4]},
             {"kind": "torus", "dims": [2, 2, 2]}, {"kind": "switched", "levels": 1},
             {"kind": "switched", "levels": 1, "ports_per_card": 2},
             {"kind": "switched", "levels": 2, "down_ports": 2, "up_ports": 2},
             {"kind": "switched", "levels": 2, "down_ports": 3, "up_ports": 1},
             {"kind": "switched", "levels": 1, "ports_per_card": 9}]
    picked = rnd.sample(cands, rnd.randint(2, 5))
    if not any(c["kind"] == "switched" for c in picked):
        picked.append({"kind": "switched", "levels": 1})
    return {"switch": "nvswitch-gen3", "card_ports": rnd.choice([4, 6]), "port_bandwidth_gb_s": rnd.choice([5, 25]),
            "hop_latency_ns": rnd.choice([0, 200, 5000]), "nic": "chapter-6.5.5",
            "endpoints_per_host": rnd.choice([8, 16, 32]),
            "connections": rnd.choice([["pairwise"], ["endpoint+channel"], ["pairwise", "endpoint+channel"]]),
            "link_cost_usd": rnd.choice([0, 50, 300]), "link_power_w": rnd.choice([0, 3]),
            "switch_cost_usd": rnd.choice([0, 2000, 20000]), "switch_power_w": rnd.choice([0, 150]),
            "ub_cost_usd_per_host": rnd.choice([0, 100]), "card_cost_usd": rnd.choice([0, 1000]),
            "max_switch_chips": rnd.choice([None, 4, 20]), "max_power_kw": rnd.choice([None, 0.2, 5.0]),
            "candidates": picked}


def random_fabric_instance(tmp_path, seed):
    rnd = random.Random(seed)
    inv = copy.deepcopy(SMALL_INVENTORY)
    inv["layers"] = rnd.choice([2, 4, 8])
    inv["experts"]["routed_bytes"] = inv["layers"] * inv["experts"]["routed"] * inv["experts"]["expert_bytes"]
    inv["dispatch_bytes_per_token"] = rnd.choice([4096, 65536, 1_000_000])
    inv["kv"]["capacity_bytes"]["per_context_token"] = rnd.choice([200, 1000, 4000])
    system = copy.deepcopy(SMALL_SYSTEM)
    system["server_cards"] = rnd.choice([1, 2, 4])
    system["max_scale_up_cards"] = max(system["server_cards"], 8)
    system["card"]["memory_gb"] = rnd.choice([24, 80])
    cards = rnd.choice([8, 16])
    sizes = sorted(rnd.sample([2, 4, 8], rnd.randint(1, 3)))
    fab = _small_fabric(rnd)
    return small_instance(tmp_path, inventory=inv, system=system, cards=cards, sizes=sizes, allow_cross_server=False,
                          context_tokens=rnd.choice([1000, 8000]), slo_ms_per_token=rnd.choice([3, 5, 20]),
                          table_tiers=["hbm", "host"], kv_tiers=["hbm"],
                          target_sessions=rnd.choice([None, 200, 2000]), fabric=fab)


def check_against_brute_force(p, results, objective: str, seed) -> None:
    """The CP-SAT answer equals :func:`brute_force` over every candidate fabric: infeasible exactly
    when no option works, else optimal at the brute-force value on one fabric, and the plan passes
    the independent evaluator with its closed-form steps equal to the model's."""
    res = solve_for(p, results=results)
    want, per_cand = brute_force(p, results, objective)
    if want is None:
        assert res.plan is None and res.status.value == "infeasible", (seed, objective)
        return
    assert res.status.value == "optimal", (seed, objective)
    assert res.value == pytest.approx(want, abs=1e-6), (seed, objective)
    used = {b.option.candidate for b in res.plan.instances}
    assert len(used) == 1, (seed, objective)
    assert per_cand[used.pop()] == pytest.approx(want, abs=1e-6), (seed, objective)
    ev = PIPELINE.evaluate(p, res.plan)
    assert ev.violations == [], (seed, objective, ev.violations)
    if objective == "cost":
        assert ev.cost_usd == pytest.approx(res.value)
    for b in res.plan.instances:  # the evaluator's closed-form step equals the model's
        (chk,) = [i for i in ev.instances if i.size == b.option.size and i.sessions_per_card == b.sessions_per_card][:1]
        assert chk.step == pytest.approx(res.results[b.index].figures.step, rel=1e-9)


def brute_force(p, results, objective):
    """Best primary objective over every fabric candidate and every vector of instance counts on
    it, with the fabric's power and switch-chip limits; returns ``(value, {candidate: value})``."""
    from objectives.supernode.cost import instance_cost

    fs = p.fabric
    per_cand = {}
    for c in fs.candidates:
        feas = [r for r in results if r.feasible and r.option.candidate == c.index]
        best = None

        def dfs(i, left, chosen):
            nonlocal best
            if i == len(feas):
                if not chosen:
                    return
                sessions = sum(r.sessions_instance * n for r, n in chosen)
                if p.target_sessions is not None and sessions < p.target_sessions:
                    return
                if fs.max_switch_chips is not None and sum(r.fabric.switch_chips * n for r, n in chosen) > fs.max_switch_chips:
                    return
                if fs.max_power_w is not None and sum(math.ceil(r.fabric.power_w - 1e-9) * n for r, n in chosen) \
                        > math.floor(fs.max_power_w + 1e-9):
                    return
                if objective == "throughput":
                    s = sum(round(1000 * r.tokens_per_s_instance) * n for r, n in chosen) / 1000 / p.cards
                elif objective == "sessions":
                    s = sessions
                else:
                    s = -sum(instance_cost(p, r) * n for r, n in chosen)
                if best is None or s > best + 1e-12:
                    best = s
                return
            r = feas[i]
            for n in range(left // r.option.size + 1):
                dfs(i + 1, left - n * r.option.size, chosen + ([(r, n)] if n else []))

        dfs(0, p.cards, [])
        if best is not None:
            per_cand[c.index] = -best if objective == "cost" else best
    if not per_cand:
        return None, per_cand
    vals = list(per_cand.values())
    return (min(vals) if objective == "cost" else max(vals)), per_cand


@pytest.mark.parametrize("seed", range(24))
def test_chosen_fabric_is_the_best_enumerated_candidate(tmp_path, seed):
    path = random_fabric_instance(tmp_path, seed)
    raw = read_yaml(path)
    for objective in ("throughput", "sessions", "cost"):
        if objective == "cost" and raw["supernode"]["target_sessions"] is None:
            continue
        p = load(raw, path, objective)
        results = evaluate_all(p)
        assert all(r.option.fabric == FABRIC for r in results)
        check_against_brute_force(p, results, objective, seed)


def test_random_instances_exercise_both_state_outcomes_and_the_limits(tmp_path):
    """The random family is not vacuous: across seeds, options are cut by connection state and by
    fabric ports, and at least one run is infeasible or limited by a fabric budget."""
    seen = set()
    for seed in range(14):
        d = tmp_path / str(seed)
        d.mkdir()
        path = random_fabric_instance(d, seed)
        p = load(read_yaml(path), path, "throughput")
        for r in evaluate_all(p):
            seen |= set(r.violations)
    assert {"connection_state", "fabric_ports"} <= seen


@needs_config
def test_pairwise_only_at_512_cards_is_infeasible_and_says_why():
    code, out, _err = run_cli(I512, "--objective", "cost", "--set", "supernode.fabric.connections=[pairwise]")
    assert code == 3
    assert "limits broken: connection_state, fabric_ports" in " ".join(out.split())


@needs_config
def test_json_envelope_is_strict_json():
    import json

    code, out, _err = run_cli(I512, "--objective", "cost", "--format", "json")
    assert code == 0
    d = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert d["plan"]["instances"][0]["fabric"] == "switched 32/32 UB"


def test_instance_files_name_a_source_for_every_fabric_figure():
    for path in (I64, I512):
        fab = yaml.safe_load(path.read_text())["supernode"]["fabric"]
        src = fab["source"]
        assert "ILLUSTRATIVE" in src["costs_and_power"]
        for k in ("card_ports", "port_bandwidth_gb_s", "endpoints_per_host"):
            assert src[k]
