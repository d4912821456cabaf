"""The supernode problem generates its fabric candidates (issue #26 item 3, ``supernode.fabric``
without ``candidates``): the acceptance case of the issue (64 and 512 cards: no dearer than the
best listed fabric, within the per-token target), the generated tori against an independent
enumeration of the factorizations, the two-level splits, the limits that cut generated
topologies named in the explanation, and an exhaustive check on random small instances that
the CP-SAT choice equals brute force over every generated candidate x organisation."""
from __future__ import annotations

import copy
import itertools
import json
import math
import random
from pathlib import Path

import pytest

from optimizer.schema_base import read_yaml
from optimizer.supernode import PIPELINE
from optimizer.supernode.evaluate import fabric_check
from optimizer.supernode.fabric import torus_shapes
from optimizer.supernode.perf import FABRIC, evaluate_all
from optimizer.supernode.schema import load
from tests.supernode_helpers import REPO, SMALL_INVENTORY, SMALL_SYSTEM, report_for, run_cli, small_instance, solve_for
from tests.test_supernode_fabric import check_against_brute_force

I64 = REPO / "instances" / "supernode_fabric_64.yaml"
I512 = REPO / "instances" / "supernode_fabric_512.yaml"
IGEN = REPO / "instances" / "supernode_fabric_generated_512.yaml"
needs_config = pytest.mark.skipif(not (REPO / "instances" / "models" / "deepseek-v3.json").exists(),
                                  reason="DeepSeek-V3 config absent")


def _generated(path: Path, objective: str = "cost", **fabric):
    raw = read_yaml(path)
    del raw["supernode"]["fabric"]["candidates"]
    raw["supernode"]["fabric"].update(fabric)
    return load(raw, path, objective)


def expected_tori(size: int) -> set[tuple[int, ...]]:
    """Every torus of 1-3 dims >= 2 multiplying to ``size``, up to a permutation of the dims,
    by brute force over ordered tuples of divisors (independent of the generator)."""
    divs = [d for d in range(2, size + 1) if size % d == 0]
    out = set()
    for k in (1, 2, 3):
        for dims in itertools.product(divs, repeat=k):
            if math.prod(dims) == size:
                out.add(tuple(sorted(dims)))
    return out


def expected_splits(ports: int, step: int) -> list[tuple[int, int]]:
    """(down, up) with down + up = ports, down >= up, up a positive multiple of step."""
    return [(d, ports - d) for d in range(ports - 1, 0, -1) if d >= ports - d and (ports - d) % step == 0]


# ------------------------------------------------------------------ (c) what is generated

def test_64_cards_generate_exactly_the_seven_tori_of_the_factorizations():
    want = expected_tori(64)
    assert want == {(64,), (2, 32), (4, 16), (8, 8), (2, 2, 16), (2, 4, 8), (4, 4, 4)}
    got = torus_shapes(64)
    assert len(got) == len(set(got)) == 7 and set(got) == want
    assert all(list(d) == sorted(d) for d in got)  # each shape once, dims non-decreasing


@pytest.mark.parametrize("size", [2, 3, 4, 12, 30, 36, 97, 128, 512, 720])
def test_generated_tori_are_the_factorizations(size):
    assert set(torus_shapes(size)) == expected_tori(size)
    assert len(torus_shapes(size)) == len(expected_tori(size))


@needs_config
def test_generated_candidates_of_the_64_and_512_instances():
    for path, size in ((I64, 64), (I512, 512)):
        p = _generated(path)
        fs = p.fabric
        assert fs.generated and fs.split_step_ports == 1
        tops = fs.topologies
        tori = {t.dims for t in tops if t.kind == "torus"}
        splits = [(t.down_ports, t.up_ports) for t in tops if t.kind == "switched" and t.levels == 2]
        assert tori == expected_tori(size)
        assert splits == expected_splits(64, 1) and len(splits) == 32
        assert sum(1 for t in tops if t.kind == "switched" and t.levels == 1) == 1
        assert len(fs.candidates) == 2 * len(tops) == 2 * (len(expected_tori(size)) + 1 + 32)
        assert all(c.generated for c in fs.candidates)
    p8 = _generated(I512, split_step_ports=8)
    assert [(t.down_ports, t.up_ports) for t in p8.fabric.topologies if t.levels == 2] == \
        [(56, 8), (48, 16), (40, 24), (32, 32)] == expected_splits(64, 8)


def test_a_split_whose_one_leaf_holds_the_domain_is_not_generated(tmp_path):
    """At 2, 4 and 8 cards on a 6-port chip only the splits with down < S (two leaves or more)
    apply to a size: 5/1 and 4/2 to 8 cards, 3/3 to 4 and 8."""
    path = small_instance(tmp_path, cards=16, sizes=[2, 4, 8], allow_cross_server=False,
                          fabric=_fabric(ports=6, card_ports=4))
    p = load(read_yaml(path), path, "throughput")
    two = {(c.down_ports, c.up_ports): c.sizes for c in p.fabric.candidates if c.levels == 2}
    assert two == {(5, 1): (8,), (4, 2): (8,), (3, 3): (4, 8)}
    sizes_of = {}
    for r in evaluate_all(p):
        c = p.fabric.candidates[r.option.candidate]
        if c.levels == 2:
            sizes_of.setdefault((c.down_ports, c.up_ports), set()).add(r.option.size)
    assert sizes_of == {(5, 1): {8}, (4, 2): {8}, (3, 3): {4, 8}}


# ------------------------------------------------------------------ (a) the acceptance case

@needs_config
@pytest.mark.parametrize("path", [I64, I512], ids=["64", "512"])
def test_generated_fabric_is_no_dearer_than_the_best_listed_and_meets_the_target(path):
    listed = solve_for(load(read_yaml(path), path, "cost"))
    p = _generated(path)
    rep = report_for(p, thresholds=False)
    res = rep.solution
    assert listed.status.value == res.status.value == "optimal"
    assert res.value <= listed.value
    ev = rep.evaluation
    assert ev.violations == [] and ev.cost_usd == pytest.approx(res.value)
    assert ev.sessions >= p.target_sessions
    for inst in ev.instances:
        assert inst.step <= p.slo_s * (1 + 1e-9)
    gen = rep.to_dict()["plan"]["fabric_candidates"]
    (b,) = res.plan.instances
    assert gen["chosen"] == [p.fabric.candidates[b.option.candidate].label]
    assert gen["candidates"] == len(p.fabric.candidates) and gen["topologies"] == len(p.fabric.topologies)
    # the chosen is the cheapest generated candidate whose domain alone holds the target
    holding = [r for r in res.results if r.feasible and r.sessions_instance * (p.cards // r.option.size) >= p.target_sessions]
    cheapest = min(r.option.size * p.fabric.card_cost_usd * (p.cards // r.option.size) + r.fabric.cost_usd for r in holding)
    assert res.value == pytest.approx(cheapest)


@needs_config
def test_512_cards_a_finer_split_than_the_listed_32_32_is_cheaper():
    """Listed: 32/32 UB at 20,806,400 USD. Every split (step 1 port) finds a leaf with fewer
    uplinks that still holds 200 sessions per card within 30 ms: cheaper, and the 32/32 row
    says what it costs more."""
    rep = report_for(_generated(I512), thresholds=False)
    (b,) = rep.solution.plan.instances
    chosen = rep.problem.fabric.candidates[b.option.candidate]
    assert chosen.levels == 2 and chosen.organisation == "endpoint+channel"
    assert chosen.down_ports + chosen.up_ports == 64 and chosen.up_ports < 32
    assert rep.solution.value < 20_806_400
    alts = {a["option"].split(",")[0]: a for a in rep.alternatives}
    assert alts["S=512 switched 32/32 UB"]["why_short"].startswith("cost: fabric +")
    out = " ".join(run_cli(I512, "--objective", "cost", "--set", "supernode.fabric.candidates=null")[1].split())
    assert f"= 90 candidates, 90 options; cut: connection_state 45, fabric_ports 2" in out
    assert f"chosen: {chosen.label}" in out


@needs_config
def test_the_generated_512_instance_file_is_the_512_instance_without_candidates():
    raw, gen = read_yaml(I512), read_yaml(IGEN)
    assert "candidates" not in gen["supernode"]["fabric"]
    raw["supernode"]["fabric"].pop("candidates")
    assert {k: v for k, v in raw["supernode"].items()} == gen["supernode"]
    assert "ILLUSTRATIVE" in gen["supernode"]["fabric"]["source"]["costs_and_power"]
    assert solve_for(load(gen, IGEN, "cost")).value == solve_for(_generated(I512)).value


# ------------------------------------------------------------------ (d) the limit that cuts a generated topology

@needs_config
def test_cut_generated_topologies_name_the_binding_limit():
    rep = report_for(_generated(I512), thresholds=False)
    alts = {a["option"].split(",")[0]: a for a in rep.alternatives}
    one = alts["S=512 switched 1 level UB"]
    assert one["why"].startswith("cannot be built: fabric_ports:")
    assert "one level of 64-port chips joins at most 64 cards" in one["why"]
    assert alts["S=512 torus 2x256 pairwise"]["why_short"] == "pairwise state > 256 KiB cache beyond 8 hosts"
    # a card of 4 ports: every 3-D torus is cut by fabric_ports, named with the ports it needs
    rep4 = report_for(_generated(I64, card_ports=4), thresholds=False)
    alts4 = {a["option"].split(",")[0]: a for a in rep4.alternatives}
    for dims in ("2x2x16", "2x4x8", "4x4x4"):
        why = alts4[f"S=64 torus {dims} UB"]["why"]
        assert why == "cannot be built: fabric_ports: a 3-D torus needs 6 ports per card, the card has 4", dims
    assert "torus 4x16" in "".join(alts4) and alts4["S=64 torus 4x16 UB"]["feasible"]


def _report_64(tmp_path, **fabric):
    fab = _fabric(card_ports=4, connections=["pairwise", "endpoint+channel"], **fabric)
    path = small_instance(tmp_path, cards=64, sizes=[64], allow_cross_server=False, table_tiers=["hbm"], fabric=fab)
    raw = read_yaml(path)
    raw["supernode"]["system"]["max_scale_up_cards"] = 64
    return report_for(load(raw, path, "throughput"), thresholds=False)


def test_cut_by_spine_ports_and_by_the_switch_chip_budget(tmp_path):
    """8-port chips at 64 cards: a 7/1 leaf needs 10 leaves per plane, more than a spine's 8
    ports (fabric_ports); 16-port chips with at most 20 switch chips: every two-level fabric
    (4 planes x at least 6 chips) is cut by switch_chips[total], and the explanation says so."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rep = _report_64(tmp_path / "a", ports=8)
    alts = {a["option"].split(",")[0]: a for a in rep.alternatives}
    assert alts["S=64 switched 7/1 pairwise"]["why"] == \
        "cannot be built: fabric_ports: 10 leaves per plane exceed a 8-port spine: two levels reach at most 56 cards"
    rep = _report_64(tmp_path / "b", ports=16, max_switch_chips=20)
    two = [a for a in rep.alternatives if a["feasible"] and "/" in a["option"].split(",")[0]]
    # splits 15/1 .. 8/8 with UB (pairwise state outgrows the cache at 16 hosts of 4 cards)
    assert len(two) == 8, [a["option"] for a in two]
    for a in two:
        assert a["fabric_figures"]["switch_chips"] > 20
        assert a["why_short"] == f"switch_chips: {a['fabric_figures']['switch_chips']} > 20", a["why_short"]
        assert a["why"].startswith("switch_chips[total]: 1 domain(s) x ")
    for b in rep.solution.plan.instances:
        assert rep.solution.results[b.index].fabric.switch_chips <= 20


# ------------------------------------------------------------------ (b) exhaustive check

def _fabric(rnd: random.Random | None = None, ports: int | None = None, card_ports: int | None = None, **extra) -> dict:
    """A generated-candidates fabric section on an inline chip of few ports (so two-level splits
    exist at small sizes)."""
    rnd = rnd or random.Random(0)
    fab = {"switch": {"ports": ports or rnd.choice([4, 6, 8]), "port_bandwidth_gb_s": 25},
           "card_ports": card_ports or rnd.choice([2, 4, 6]), "port_bandwidth_gb_s": rnd.choice([5, 25]),
           "hop_latency_ns": rnd.choice([0, 200, 5000]), "nic": "chapter-6.5.5",
           "endpoints_per_host": rnd.choice([8, 16, 32]),
           "connections": rnd.choice([["pairwise"], ["endpoint+channel"], ["pairwise", "endpoint+channel"]]),
           "link_cost_usd": rnd.choice([0, 50, 300]), "link_power_w": rnd.choice([0, 3]),
           "switch_cost_usd": rnd.choice([0, 2000, 20000]), "switch_power_w": rnd.choice([0, 150]),
           "ub_cost_usd_per_host": rnd.choice([0, 100]), "card_cost_usd": rnd.choice([0, 1000]),
           "max_switch_chips": rnd.choice([None, 4, 30]), "max_power_kw": rnd.choice([None, 0.3, 5.0])}
    if rnd.random() < 0.3:
        fab["split_step_ports"] = 2
    fab.update(extra)
    return fab


def random_generated_instance(tmp_path: Path, seed: int) -> Path:
    rnd = random.Random(1000 + seed)
    inv = copy.deepcopy(SMALL_INVENTORY)
    inv["layers"] = rnd.choice([2, 4, 8])
    inv["experts"]["routed_bytes"] = inv["layers"] * inv["experts"]["routed"] * inv["experts"]["expert_bytes"]
    inv["dispatch_bytes_per_token"] = rnd.choice([4096, 65536, 1_000_000])
    inv["kv"]["capacity_bytes"]["per_context_token"] = rnd.choice([200, 1000, 4000])
    system = copy.deepcopy(SMALL_SYSTEM)
    system["server_cards"] = rnd.choice([1, 2, 4])
    system["max_scale_up_cards"] = max(system["server_cards"], 8)
    system["card"]["memory_gb"] = rnd.choice([24, 80])
    cards = rnd.choice([12, 16, 24])
    sizes = sorted(rnd.sample([s for s in (2, 3, 4, 6, 8, 12) if cards % s == 0], rnd.randint(1, 3)))
    extra = {}
    if rnd.random() < 0.5:  # an expert-load skew from a random matrix trace
        experts = rnd.choice([8, 16, 24])
        counts = [[[int(rnd.lognormvariate(0, 1) * 100) + 1 for _ in range(experts)] for _ in range(rnd.randint(1, 3))]]
        (tmp_path / "load.json").write_text(json.dumps(counts))
        extra["expert_load"] = {"trace": "load.json", "format": "matrix"}
    return small_instance(tmp_path, inventory=inv, system=system, cards=cards, sizes=sizes, allow_cross_server=False,
                          context_tokens=rnd.choice([1000, 8000]), slo_ms_per_token=rnd.choice([3, 5, 20]),
                          table_tiers=["hbm", "host"], kv_tiers=["hbm"],
                          target_sessions=rnd.choice([None, 200, 2000]), fabric=_fabric(rnd), **extra)


@pytest.mark.parametrize("seed", range(32))
def test_chosen_generated_fabric_is_the_brute_force_best(tmp_path, seed):
    """The generated set is the independent enumeration; every buildable candidate's closed-form
    figures equal the fabric model's; the CP-SAT optimum and its fabric equal brute force over
    every generated candidate x organisation and every vector of instance counts (no plan iff
    brute force finds none)."""
    path = random_generated_instance(tmp_path, seed)
    raw = read_yaml(path)
    fab = raw["supernode"]["fabric"]
    step = fab.get("split_step_ports", 1)
    for objective in ("throughput", "sessions", "cost"):
        if objective == "cost" and raw["supernode"]["target_sessions"] is None:
            continue
        p = load(raw, path, objective)
        fs = p.fabric
        want_topos = [("torus", d, None, None) for S in p.sizes for d in sorted(expected_tori(S), key=lambda d: (len(d), d))]
        if any(S > 1 for S in p.sizes):
            want_topos.append(("switched", None, None, None))
        want_topos += [("switched", None, d, u) for d, u in expected_splits(fs.switch_ports, step)
                       if any(S > d for S in p.sizes)]
        assert [(t.kind, t.dims, t.down_ports, t.up_ports) for t in fs.topologies] == want_topos, seed
        assert len(fs.candidates) == len(want_topos) * len(fab["connections"])
        results = evaluate_all(p)
        assert all(r.option.fabric == FABRIC for r in results)
        for r in results:
            c = fs.candidates[r.option.candidate]
            fc = fabric_check(p, c, r.option.size)
            assert fc["buildable"] == ("fabric_ports" not in r.violations), (seed, c.label)
            assert fc["state_ok"] == ("connection_state" not in r.violations), (seed, c.label)
            if fc["buildable"]:
                assert fc["per_byte"] == pytest.approx(r.fabric.a2a_s_per_byte, rel=1e-9), (seed, c.label)
                assert fc["cost"] == pytest.approx(r.fabric.cost_usd) and fc["chips"] == r.fabric.switch_chips
        check_against_brute_force(p, results, objective, seed)


def test_the_random_family_is_not_vacuous(tmp_path):
    """Across the seeds: two-level splits are generated, options are cut by fabric ports and by
    connection state, some runs have a skew, some are infeasible and some built fabrics are
    two-level."""
    seen, skewed, infeasible, two_level = set(), 0, 0, 0
    for seed in range(32):
        d = tmp_path / str(seed)
        d.mkdir()
        path = random_generated_instance(d, seed)
        p = load(read_yaml(path), path, "throughput")
        skewed += p.expert_load is not None
        results = evaluate_all(p)
        for r in results:
            seen |= set(r.violations)
        res = solve_for(p, results=results)
        if res.plan is None:
            infeasible += 1
        elif any(p.fabric.candidates[b.option.candidate].levels == 2 for b in res.plan.instances):
            two_level += 1
    assert {"connection_state", "fabric_ports"} <= seen
    assert skewed >= 8 and two_level >= 1 and infeasible >= 1, (skewed, two_level, infeasible)


# ------------------------------------------------------------------ input

@pytest.mark.parametrize("change, field, words", [
    ({"split_step_ports": 5}, "supernode.fabric.split_step_ports", "more than half the 8-port chip"),
    ({"split_step_ports": 2, "candidates": [{"kind": "switched", "levels": 1}]}, "supernode.fabric",
     "split_step_ports applies to generated candidates only"),
    ({"switch": {"ports": 1, "port_bandwidth_gb_s": 25}}, "supernode.fabric.switch", ""),
])
def test_bad_generation_input_is_one_line_exit_2(tmp_path, change, field, words):
    fab = dict(_fabric(ports=8, card_ports=4), **change)
    path = small_instance(tmp_path, cards=8, sizes=[4, 8], allow_cross_server=False, fabric=fab)
    code, _out, err = run_cli(path)
    lines = [x for x in err.strip().splitlines() if x]
    assert code == 2 and len(lines) == 1 and field in lines[0] and words in lines[0], err
