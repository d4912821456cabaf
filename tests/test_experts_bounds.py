"""Written plans satisfy their own constraints; reported bounds are valid lower bounds; status
``optimal`` only when the plan meets a valid bound (relative tolerance OPTIMALITY_REL_TOL).

Brute force (tests/experts_helpers.py) enumerates every placement of small layers.
"""
import itertools
import json
from math import comb

import numpy as np
import pytest

from objectives.experts import registry
from optimizer.experts.eplb import rebalance
from optimizer.experts.plan import plan_from_phy2log
from optimizer.experts.solve import OPTIMALITY_REL_TOL, LayerTask, solve_layer
from tests.experts_helpers import (brute_force_max_load, distinct_per_gpu, gpu_loads_from_phy2log,
                                   optimal_split_lp, run_json, write_instance)

TOL = 1e-6  # relative, on loads of tens to thousands of tokens


def _task(w, G, S, split="even"):
    w = np.asarray(w, dtype=np.int64)
    slots = [S] * G
    p2l = rebalance(w[None], G * S, 1, 1, G)[0][0]
    return LayerTask(0, w, slots, [0] * G, 1, split, registry()["max-load"], plan_from_phy2log(p2l, len(w), slots),
                     None, 0.0, 0.02, None)


def _instance(tmp_path, trace, **fields):
    (tmp_path / "t.json").write_text(json.dumps(trace))
    base = dict(format="matrix", num_nodes=1, fit_windows="all", evaluate_windows="none")
    base.update(fields)
    return write_instance(tmp_path, "t.json", **base)


# ------------------------------------------------------------------ the reported layers

def test_issue_layer_even_split_writes_distinct_gpus_and_scores_401(tmp_path):
    """[[353, 1000, 192]] on 4 GPUs x 2 slots: EPLB co-locates expert 1 (max load 400); the best
    distinct-GPU plan is 401, which must be written, bounded and proven."""
    w = [353, 1000, 192]
    assert brute_force_max_load(w, 4, 2) == pytest.approx(401.0, abs=1e-9)
    assert brute_force_max_load(w, 4, 2, distinct=False) == pytest.approx(397 + 1 / 3, abs=1e-9)
    inst = _instance(tmp_path, [w], num_gpus=4, slots_per_gpu=2, split="even")
    code, rep = run_json(inst, "--output", tmp_path / "out")
    assert code == 0
    lay = rep["plan"]["layers"][0]
    assert lay["greedy"]["max_load"] == pytest.approx(400.0, abs=1e-9)
    assert lay["optimized"]["greedy_colocated"] is True
    assert lay["greedy"]["gap"] is None  # the bound does not apply to a co-located plan
    assert lay["optimized"]["max_load"] == pytest.approx(401.0, abs=1e-9)
    assert lay["optimized"]["bound"] == pytest.approx(401.0, abs=401 * TOL)
    assert lay["optimized"]["bound"] <= 401.0 + 1e-9
    assert lay["optimized"]["status"] == "optimal" and rep["status"] == "optimal"
    pl = json.loads((tmp_path / "out" / "placement.json").read_text())
    sg = json.loads((tmp_path / "out" / "sglang_expert_location.json").read_text())
    for row in (pl["phy2log"][0], sg["physical_to_logical_map"][0]):
        assert distinct_per_gpu(row, 2)
        assert max(gpu_loads_from_phy2log(row, w, 2)) == pytest.approx(401.0, abs=1e-9)


def test_issue_layer_optimal_split_bound_not_above_trivial(tmp_path):
    """[[73, 11, 61]] on 3 GPUs x 3 slots, split optimal: every GPU can hold every expert, so
    145/3 = 48.33 is attained (the trivial layout does it); the old report said 48.75 proven."""
    w = [73, 11, 61]
    assert brute_force_max_load(w, 3, 3, split="optimal") == pytest.approx(145 / 3, abs=1e-9)
    inst = _instance(tmp_path, [w], num_gpus=3, slots_per_gpu=3, split="optimal")
    code, rep = run_json(inst)
    assert code == 0
    lay = rep["plan"]["layers"][0]
    assert lay["trivial"]["max_load"] == pytest.approx(145 / 3, abs=1e-9)
    assert lay["optimized"]["bound"] <= lay["trivial"]["max_load"] + 1e-9
    assert lay["optimized"]["max_load"] == pytest.approx(145 / 3, rel=TOL)
    assert lay["optimized"]["status"] == "optimal"


def test_supply_demand_formula_matches_highs_lp():
    """The brute force's optimal-split value (max over expert sets) equals the HiGHS LP."""
    rng = np.random.default_rng(5)
    for _ in range(60):
        E, G = int(rng.integers(2, 6)), int(rng.integers(1, 5))
        w = rng.integers(0, 100, E)
        X = (rng.random((E, G)) < 0.5).astype(int)
        X[np.arange(E), rng.integers(0, G, E)] = 1          # every expert somewhere
        holders = [set(np.flatnonzero(X[e])) for e in range(E)]
        formula = max(sum(w[e] for e in A) / len(set().union(*(holders[e] for e in A)))
                      for r in range(1, E + 1) for A in itertools.combinations(range(E), r))
        assert optimal_split_lp(w, X) == pytest.approx(formula, rel=1e-9, abs=1e-9)


# ------------------------------------------------------------------ random small layers vs brute force

def _random_layers(seed: int, count: int, max_choices: int):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        E = int(rng.integers(2, 6))
        G = int(rng.integers(1, 5))
        S = int(rng.integers(1, min(E, 3) + 1))
        if G * S < E:
            continue
        if comb(E, S) ** G > max_choices:
            continue
        kind = rng.integers(0, 3)
        if kind == 0:
            w = rng.integers(0, 20, E)                      # small counts, many ties
        elif kind == 1:
            w = (rng.lognormal(0, 1.5, E) * 200).astype(np.int64)   # skewed
        else:
            w = rng.integers(100, 1100, E)
        if w.sum() == 0:
            w[0] = 1
        out.append((w, G, S))
    return out


def _check_layer(w, G, S, split):
    out = solve_layer(_task(w, G, S, split))
    bf = brute_force_max_load(w, G, S, split)
    X = out.plan.X
    # the plan satisfies its own constraints
    assert X.max() <= 1 and (X.sum(axis=0) == S).all() and (X.sum(axis=1) >= 1).all()
    # its reported value is its real value (independent evaluation)
    if split == "even":
        row = out.plan.phy2log([S] * G)
        assert max(gpu_loads_from_phy2log(row, w, S)) == pytest.approx(out.max_load, rel=1e-9, abs=1e-9)
    else:
        assert np.allclose(out.plan.F.sum(axis=1), 1.0)
        assert float(np.max(np.asarray(w, float) @ out.plan.F)) == pytest.approx(out.max_load, rel=1e-9, abs=1e-9)
        assert out.max_load >= optimal_split_lp(w, X) - 1e-6
    # a feasible plan cannot beat the optimum; the bound is never above it
    assert out.max_load >= bf - 1e-9 * max(1.0, bf)
    assert out.bound <= bf + 1e-9 * max(1.0, bf)
    assert out.gap == pytest.approx(0.0 if out.max_load <= 0 else (out.max_load - out.bound) / out.max_load, abs=1e-12)
    # status follows the gap: optimal only when the value meets a valid bound
    if out.proven:
        assert out.status.value == "optimal" and out.gap <= OPTIMALITY_REL_TOL
        assert out.max_load == pytest.approx(bf, rel=2 * OPTIMALITY_REL_TOL, abs=1e-9)
    else:
        assert out.status.value == "feasible" and out.gap > OPTIMALITY_REL_TOL
    return out, bf


def test_even_split_random_layers_vs_brute_force():
    layers = _random_layers(2024, 300, 1500)
    proven = greedy_beats_valid = 0
    for w, G, S in layers:
        out, bf = _check_layer(w, G, S, "even")
        proven += out.proven
        greedy = _task(w, G, S).greedy
        if greedy.X.max() > 1 and greedy.loads(w).max() < bf - 1e-9:
            greedy_beats_valid += 1   # the old code wrote EPLB's co-located plan here
            assert out.greedy_colocated and out.max_load == pytest.approx(bf, rel=1e-9)
    # exact units on these sizes: the whole-layer model proves every one
    assert proven == len(layers)
    assert greedy_beats_valid >= 10  # the sweep exercises the fault (29 layers with this seed)


def test_optimal_split_random_layers_vs_brute_force():
    layers = _random_layers(77, 150, 400)
    proven = 0
    for w, G, S in layers:
        out, bf = _check_layer(w, G, S, "optimal")
        proven += out.proven
    assert proven == len(layers)


def test_bound_stays_valid_with_rounded_units(monkeypatch):
    """With a coarse load unit (per-replica loads rounded; optimised split at one unit per
    token) the model's bound is made valid by its rounding slack: never above brute force."""
    import optimizer.experts.model as model

    monkeypatch.setattr(model, "LOAD_UNITS_PER_LAYER", 50.0)
    for split, count, cap in (("even", 120, 1500), ("optimal", 60, 400)):
        for w, G, S in _random_layers(31 if split == "even" else 32, count, cap):
            w = w * 7 + 3   # totals far above 50 units: rounded per-replica loads / whole-token shares
            _check_layer(w, G, S, split)


def test_cli_never_writes_colocated_replicas(tmp_path):
    """Many random small layers through the CLI: every written phy2log row keeps each GPU's
    experts distinct and matches the reported max load, bound <= it."""
    rng = np.random.default_rng(11)
    for E, G, S in ((3, 4, 2), (4, 3, 3), (5, 4, 2)):
        w = (rng.lognormal(0, 1.3, (40, E)) * 300).astype(int) + 1
        sub = tmp_path / f"{E}_{G}_{S}"
        sub.mkdir()
        inst = _instance(sub, w.tolist(), num_gpus=G, slots_per_gpu=S)
        code, rep = run_json(inst, "--output", sub / "out")
        assert code == 0
        pl = json.loads((sub / "out" / "placement.json").read_text())
        for i, row in enumerate(pl["phy2log"]):
            assert distinct_per_gpu(row, S)
            lay = rep["plan"]["layers"][i]["optimized"]
            assert max(gpu_loads_from_phy2log(row, w[i], S)) == pytest.approx(lay["max_load"], rel=1e-12)
            assert lay["bound"] <= lay["max_load"] + 1e-9
            assert lay["max_load"] == pytest.approx(brute_force_max_load(w[i], G, S), rel=TOL)


def test_slot_bound_is_valid_and_proves_the_eplb_readme_layer():
    """The slot bound never exceeds the exhaustive optimum on random small layers (equal slots
    per GPU, every expert once at least), and on DeepSeek EPLB's README layer it equals the
    optimum, 136 tokens, so the layer is proven."""
    from optimizer.experts.solve import slot_bound

    rng = np.random.default_rng(25)
    tight = 0
    for E, G, S in ((3, 4, 2), (4, 3, 3), (5, 4, 2), (4, 2, 3), (6, 4, 2), (3, 3, 1)):
        for _ in range(6):
            w = (rng.lognormal(0, 1.2, E) * 100).astype(int) + 1
            sb = slot_bound(w, [S] * G)
            best = brute_force_max_load(w, G, S)
            assert sb is not None and sb <= best + 1e-9, (w, G, S, sb, best)
            tight += abs(sb - best) <= 1e-9
    assert tight > 0  # the bound is not vacuous
    w0 = np.array([90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86])
    assert slot_bound(w0, [2] * 8) == pytest.approx(136.0)
    assert brute_force_max_load(w0[:5], 4, 2) >= slot_bound(w0[:5], [2] * 4)
    assert slot_bound(w0, [2] * 7 + [3]) is None  # unequal slots: no claim


def _eplb_shaped_layers(tmp_path, w: list) -> list:
    """The CLI's optimised layers of trace ``w`` (a layer x expert matrix) on DeepSeek EPLB's README
    shape: 8 GPUs x 2 slots, 2 nodes, 4 groups."""
    (tmp_path / "w.json").write_text(json.dumps(w))
    inst = tmp_path / "e.yaml"
    inst.write_text("experts: {trace: w.json, format: matrix, num_gpus: 8, num_nodes: 2, num_groups: 4, "
                    "slots_per_gpu: 2, evaluate_windows: none}\nname: eplb shaped\n")
    code, rep = run_json(inst)
    assert code == 0
    return rep["plan"]["layers"]


def test_the_eplb_readme_example_is_proven_optimal(tmp_path):
    lays = _eplb_shaped_layers(tmp_path, [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                                          [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
    assert [lay["optimized"]["max_load"] for lay in lays] == [136, 172]
    assert all(lay["optimized"]["gap"] == 0.0 for lay in lays)


@pytest.mark.parametrize("seed", range(4))
def test_slot_search_is_the_exhaustive_optimum(seed):
    """The slot search packs each candidate replica-count vector exactly (distinct experts per
    GPU): on random small equal-slot layers its bound equals the exhaustive optimum over every
    distinct-GPU plan, and its phy2log row is a distinct-GPU plan with that max load."""
    from optimizer.experts.solve import slot_search

    rng = np.random.default_rng(100 + seed)
    for E, G, S in ((3, 4, 2), (4, 3, 3), (5, 4, 2), (4, 2, 3), (6, 4, 2), (5, 3, 3), (4, 4, 2)):
        for _ in range(4):
            w = (rng.lognormal(0, 1.2, E) * 100).astype(int) + 1
            bound, row = slot_search(w, [S] * G)
            best = brute_force_max_load(w, G, S)
            assert bound == pytest.approx(best, rel=1e-12), (w, G, S)
            assert distinct_per_gpu(row, S)
            assert max(gpu_loads_from_phy2log(row, w, S)) == pytest.approx(best, rel=1e-12)


def test_random_twelve_expert_layers_are_proven(tmp_path):
    """The exactness benchmark's random 12-expert layers (16 slots on 8 GPUs, seeds 1-5) and the
    EPLB README layers: every layer proven optimal by the slot search, 0 gap."""
    w = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86]]
    w += [row for s in range(1, 6) for row in np.random.default_rng(s).integers(1, 200, (2, 12)).tolist()]
    lays = _eplb_shaped_layers(tmp_path, w)
    assert len(lays) == 11
    assert all(lay["optimized"]["gap"] == 0.0 for lay in lays)
    assert lays[0]["optimized"]["max_load"] == 136
