"""Random small supernode instances: the CP-SAT optimum equals brute-force enumeration of every
plan, the independent evaluator agrees with the model, and hand-computed figures hold."""
from __future__ import annotations

import copy
import dataclasses
import math
import random

import pytest

from optimizer.schema_base import read_yaml
from optimizer.supernode import PIPELINE
from optimizer.supernode.evaluate import evaluate
from optimizer.supernode.plan import BuiltOption, SupernodePlan
from optimizer.supernode.perf import SCALE_UP, Option, evaluate_all, figures, single_user
from optimizer.supernode.schema import load
from tests.supernode_helpers import SMALL_INVENTORY, SMALL_SYSTEM, small_instance, solve_for


def random_instance(tmp_path, seed):
    rnd = random.Random(seed)
    inv = copy.deepcopy(SMALL_INVENTORY)
    inv["layers"] = rnd.choice([2, 4, 8])
    inv["experts"]["routed"] = rnd.choice([8, 16, 32])
    inv["experts"]["per_token"] = rnd.choice([1, 2, 4])
    inv["experts"]["expert_bytes"] = rnd.randint(20, 200) * 1_000_000
    inv["experts"]["routed_bytes"] = inv["layers"] * inv["experts"]["routed"] * inv["experts"]["expert_bytes"]
    inv["weights"]["replicated_read_bytes"] = rnd.randint(1, 6) * 1_000_000_000
    inv["weights"]["replicated_resident_bytes"] = inv["weights"]["replicated_read_bytes"] + 200_000_000
    inv["engram"] = {"layers": [rnd.randint(0, inv["layers"] - 1)], "rows": [rnd.randint(1, 20) * 1_000_000],
                     "row_bytes": rnd.choice([256, 264, 512]), "rows_per_token": rnd.choice([4, 8, 24]),
                     "projection_bytes": 10_000_000}
    inv["kv"]["capacity_bytes"]["per_context_token"] = rnd.choice([200, 1000, 4000])
    system = copy.deepcopy(SMALL_SYSTEM)
    system["card"]["memory_gb"] = rnd.choice([10, 24, 80])
    system["tiers"]["host"]["round_trip_us"] = rnd.choice([1.0, 50.0, 500.0])
    system["tiers"]["host"]["random_reads_per_s"] = rnd.choice([1e6, 1e8])
    system["tiers"]["pool"]["capacity_gb"] = rnd.choice([1, 12, 100])
    cards = rnd.choice([8, 16])
    sizes = sorted(rnd.sample([2, 4, 8], rnd.randint(1, 3)))
    return small_instance(tmp_path, inventory=inv, system=system, cards=cards, sizes=sizes,
                          allow_cross_server=rnd.random() < 0.5, context_tokens=rnd.choice([1000, 8000, 32000]),
                          slo_ms_per_token=rnd.choice([5, 20, 50]), table_tiers=["hbm", "host", "pool"],
                          kv_tiers=rnd.choice([["hbm"], ["hbm", "pool"]]),
                          target_sessions=rnd.choice([None, 500, 5000]))


def brute_force(p, results, objective):
    """Best primary objective over every vector of instance counts (None: no valid plan)."""
    feas = [r for r in results if r.feasible]
    pool_cap = p.hw.tiers["pool"].capacity_bytes if "pool" in p.hw.tiers else math.inf
    best = None

    def score(chosen):
        if not chosen:
            return None
        cards = sum(r.option.size * c for r, c in chosen)
        sessions = sum(r.sessions_instance * c for r, c in chosen)
        if p.target_sessions is not None and sessions < p.target_sessions:
            return None
        if sum(math.ceil(r.pool_bytes / 1e6 - 1e-9) * c for r, c in chosen) > math.floor(pool_cap / 1e6 + 1e-9):
            return None
        if objective == "throughput":
            return sum(round(1000 * r.tokens_per_s_instance) * c for r, c in chosen) / 1000 / p.cards
        if objective == "sessions":
            return sessions
        if objective == "cards":
            return -cards
        return -max(math.ceil(r.single.token * 1e9 - 1e-6) for r, _ in chosen) / 1e6

    def dfs(i, left, chosen):
        nonlocal best
        if i == len(feas):
            s = score(chosen)
            if s is not None and (best is None or s > best + 1e-12):
                best = s
            return
        r = feas[i]
        for c in range(left // r.option.size + 1):
            dfs(i + 1, left - c * r.option.size, chosen + ([(r, c)] if c else []))

    dfs(0, p.cards, [])
    if best is None:
        return None
    return -best if objective in ("cards", "single_user") else best


@pytest.mark.parametrize("seed", range(12))
def test_cpsat_equals_brute_force(tmp_path, seed):
    path = random_instance(tmp_path, seed)
    for objective in ("throughput", "sessions", "cards", "single_user"):
        p = load(read_yaml(path), path, objective if objective != "cards" else None)
        if objective == "cards" and p.target_sessions is None:
            continue
        results = evaluate_all(p)
        res = solve_for(p, objective, results=results)
        want = brute_force(p, results, objective)
        if want is None:
            assert res.plan is None and res.status.value == "infeasible", (seed, objective)
            continue
        assert res.status.value == "optimal"
        assert res.value == pytest.approx(want, abs=1e-6), (seed, objective)
        ev = PIPELINE.evaluate(p, res.plan)
        assert ev.violations == [], (seed, objective, ev.violations)
        if objective == "throughput":
            assert ev.tokens_per_s_per_card == pytest.approx(res.value, rel=1e-6, abs=1e-3)


@pytest.mark.parametrize("seed", range(6))
def test_evaluator_agrees_with_model_on_every_option(tmp_path, seed):
    path = random_instance(tmp_path, 100 + seed)
    p = dataclasses.replace(load(read_yaml(path), path, None), target_sessions=None)
    for r in evaluate_all(p):
        if not r.feasible:
            continue
        o = r.option
        ev = evaluate(p, SupernodePlan((BuiltOption(o, r.sessions_per_card, 1),)))
        assert ev.violations == []
        assert ev.instances[0].step == pytest.approx(r.figures.step, rel=1e-9)
        assert ev.instances[0].single_user == pytest.approx(r.single.token, rel=1e-9)
        # one more session per card breaks a limit (the batch is the largest)
        more = evaluate(p, SupernodePlan((BuiltOption(o, r.sessions_per_card + 1, 1),)))
        assert more.violations or r.limit not in ("memory", "slo")


def test_hand_computed_small(tmp_path):
    """Figures of the small model by hand (S = 4 cards on NVLink, table in HBM, KV in HBM, N = 10)."""
    path = small_instance(tmp_path)
    p = load(read_yaml(path), path, None)
    f = figures(p, Option(4, SCALE_UP, ("hbm",), "hbm"), 10)
    # W = 2.5 GB + (6.4 GB experts + 5.0 GB table + 0.1 GB projection) / 4 = 5.375 GB
    assert f.weights_per_card == pytest.approx(5.375e9)
    k = 1e6 + 1000 * 4000
    assert f.kv_per_session == pytest.approx(k)
    # experts read: 4 layers x 4 experts x (1 - (1 - 2/16)^40) x 100 MB
    experts = 4 * 4 * (1 - (14 / 16) ** 40) * 1e8
    reads = 2e9 + experts + 10 * 8 * 500 + 10 * (1e6 + 500 * 4000)
    assert f.hbm_reads == pytest.approx(reads)
    # All-to-All: 1 us + 10 x 4096 B x 3/4 / 100 GB/s
    a2a = 1e-6 + 10 * 4096 * 0.75 / 100e9
    assert f.t_a2a == pytest.approx(a2a)
    compute = 10 * (4e9 + 1000 * 4000) / 100e12
    assert f.step == pytest.approx(max(reads / 1e12, compute) + 2 * 4 * a2a)
    s = single_user(p, Option(4, SCALE_UP, ("hbm",), "hbm"))
    t_w = (2e9 + 8 * 500) / 1e12
    assert s.token == pytest.approx(max(t_w, (1e6 + 500 * 4000) / 1e12, (4e9 + 4e6) / 100e12) / 0.9
                                    + 1 * 4 * (1e-6 + 4096 * 0.75 / 100e9))  # one exchange per MoE layer at batch 1


def test_hand_computed_host_prefetch_and_cross_server(tmp_path):
    """Host fetch, prefetch excess and the NIC share of an instance spanning two servers."""
    path = small_instance(tmp_path)
    p = load(read_yaml(path), path, None)
    o = Option(8, "cross_server", ("host",), "hbm")
    f = figures(p, o, 100)
    # NVLink share 3/8 at 100 GB/s + 1 us, NIC share 4/8 at 10 GB/s + 5 us: the NIC is slower
    b = 100 * 4096
    assert f.t_a2a == pytest.approx(max(1e-6 + b * 3 / 8 / 100e9, 5e-6 + b * 4 / 8 / 10e9))
    # host: 2 us + max(100 x 8 rows x 4 cards / 1e8 reads/s, 100 x 8 x 500 B / 32 GB/s)
    fetch = 2e-6 + max(100 * 8 * 4 / 1e8, 100 * 8 * 500 / 32e9)
    d = f.prefetch["host"]
    assert d["fetch_s"] == pytest.approx(fetch)
    base = f.step - f.prefetch_excess
    assert d["window_s"] == pytest.approx(1 * base / 4)
    assert f.prefetch_excess == pytest.approx(max(0.0, fetch - base / 4))


@pytest.mark.parametrize("seed", range(6))
def test_largest_batch_has_the_most_tokens_per_card(tmp_path, seed):
    """The model builds each option at its largest feasible batch; no smaller batch of the same
    option gives more tokens/s per card (so the throughput objective loses nothing)."""
    import numpy as np

    from optimizer.supernode.perf import step_times

    path = random_instance(tmp_path, 200 + seed)
    p = load(read_yaml(path), path, None)
    for r in evaluate_all(p):
        if not r.feasible:
            continue
        n = np.arange(1, r.sessions_per_card + 1, dtype=float)
        tput = n / step_times(p, r.option, n)["step"]
        assert tput.max() <= r.figures.tokens_per_s_card * (1 + 1e-12)
