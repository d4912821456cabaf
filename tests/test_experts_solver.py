"""Optimised placement: brute force on tiny layers, never above greedy, independent evaluator."""
import json

import numpy as np
import pytest

from objectives.experts import registry
from optimizer.experts.eplb import rebalance
from optimizer.experts.plan import plan_from_phy2log
from optimizer.experts.solve import LayerTask, analytic_bound, solve_layer
from tests.experts_helpers import REPO, brute_force_max_load, gpu_loads_from_phy2log, run_cli, run_json, write_instance


def _task(w, G, S, N=1, groups=1, objective="max-load", split="even", prev=None, tl=5.0, **kw):
    w = np.asarray(w, dtype=np.int64)
    slots = [S] * G
    p2l = rebalance(w[None], G * S, groups, N, G)[0][0]
    return LayerTask(0, w, slots, [g // (G // N) for g in range(G)], N, split, registry()[objective],
                     plan_from_phy2log(p2l, len(w), slots), prev, 0.0, 0.02, tl, **kw)


@pytest.mark.parametrize("seed", range(12))
def test_optimised_equals_brute_force_on_tiny_layers(seed):
    rng = np.random.default_rng(seed)
    E = int(rng.integers(3, 6))
    G = int(rng.integers(2, 4))
    S = int(rng.integers(max(2, -(-E // G)), min(E, 3) + 1))
    w = rng.integers(0, 60, E) * rng.integers(1, 4, E)
    w[0] += 1
    out = solve_layer(_task(w, G, S))
    assert out.mode in ("exact", "start at bound")  # small layers: the whole-layer model or the exact slot search
    bf = brute_force_max_load(w, G, S)
    # the written plan keeps replicas on distinct GPUs even where EPLB's co-located plan is lighter
    assert out.plan.X.max() <= 1
    assert out.max_load == pytest.approx(bf, rel=1e-9, abs=1e-9)
    assert out.proven and out.gap == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("seed", range(15))
def test_optimised_never_above_greedy_random(seed):
    rng = np.random.default_rng(100 + seed)
    E = int(rng.integers(4, 24))
    N = int(rng.choice([1, 2]))
    G = N * int(rng.integers(1, 5))
    S = int(rng.integers(-(-E // G), min(E, -(-E // G) + 3) + 1))
    w = (rng.lognormal(0, 1.2, E) * 100).astype(np.int64) + 1
    groups = int(rng.choice([1, 2])) if E % 2 == 0 else 1
    t = _task(w, G, S, N=N, groups=groups, tl=0.3)
    out = solve_layer(t)
    greedy_max = t.greedy.loads(w).max()
    if t.greedy.X.max() <= 1:                         # greedy is a start when it is a valid plan
        assert out.max_load <= greedy_max * (1 + 1e-12)
    assert out.bound <= out.max_load * (1 + 1e-12)
    assert out.bound >= analytic_bound(w, t.slots, "even") - 1e-9
    X = out.plan.X
    assert (X.sum(axis=0) == S).all()                 # exactly S replicas per GPU
    assert (X.sum(axis=1) >= 1).all()                 # every expert placed
    assert X.max() <= 1                               # replicas on distinct GPUs, always


def test_split_optimal_not_worse_than_even_and_shares_add_up():
    w = np.array([900, 40, 30, 25, 20, 10, 5, 1])
    even = solve_layer(_task(w, 4, 3))
    opt = solve_layer(_task(w, 4, 3, split="optimal"))
    assert opt.max_load <= even.max_load + 1e-9
    assert np.allclose(opt.plan.F.sum(axis=1), 1.0)
    assert opt.max_load == pytest.approx(w.sum() / 4, abs=1.0)   # perfectly splittable here


def test_migration_keeps_previous_plan_when_it_meets_the_target():
    w = np.array([50, 40, 30, 20, 10, 5])
    first = solve_layer(_task(w, 3, 3))
    prev = first.plan.X.copy()
    again = solve_layer(_task(w, 3, 3, objective="migration", prev=prev))
    assert int(((again.plan.X > 0) & (prev == 0)).sum()) == 0
    assert again.max_load <= first.max_load * 1.02 + 1e-9


def test_inter_node_covers_more_nodes_within_tolerance():
    w = np.array([400, 300, 200, 100, 50, 40, 30, 20])
    base = solve_layer(_task(w, 4, 3, N=2))
    inter = solve_layer(_task(w, 4, 3, N=2, objective="inter-node"))
    from optimizer.experts.plan import cross_node_tokens
    node_of = np.array([0, 0, 1, 1])
    assert cross_node_tokens(inter.plan, w, node_of, 2) <= cross_node_tokens(base.plan, w, node_of, 2) + 1e-9
    assert inter.max_load <= base.max_load * 1.02 + 1e-9


def test_cli_outputs_checked_by_independent_evaluator(tmp_path):
    rng = np.random.default_rng(7)
    loads = (rng.lognormal(0, 1, (3, 2, 12)) * 50).astype(int) + 1   # [windows, layers, experts]
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    inst = write_instance(tmp_path, "t.json", num_gpus=4, num_nodes=2, num_groups=2, slots_per_gpu=4)
    code, rep = run_json(inst, "--output", tmp_path / "out", "--time-limit", "1.5")
    assert code == 0
    assert rep["plan"]["trace"]["fitted_windows"] == [0, 1] and rep["plan"]["trace"]["evaluated_windows"] == [2]
    pl = json.loads((tmp_path / "out" / "placement.json").read_text())
    sg = json.loads((tmp_path / "out" / "sglang_expert_location.json").read_text())
    assert sg["physical_to_logical_map"] == pl["phy2log"]
    fit = loads[:2].sum(axis=0)
    for i, row in enumerate(pl["phy2log"]):
        assert len(row) == 16
        per_gpu = [row[g * 4:(g + 1) * 4] for g in range(4)]
        assert all(len(set(p)) == 4 for p in per_gpu)                         # distinct GPUs
        assert pl["logcnt"][i] == np.bincount(row, minlength=12).tolist()
        for e in range(12):
            reps = [r for r in pl["log2phy"][i][e] if r >= 0]
            assert sorted(reps) == [r for r in range(16) if row[r] == e]
        ld = gpu_loads_from_phy2log(row, fit[i], 4)
        lay = rep["plan"]["layers"][i]
        assert max(ld) == pytest.approx(lay["optimized"]["max_load"])
        if lay["optimized"]["greedy_colocated"] is False:
            assert lay["optimized"]["max_load"] <= lay["greedy"]["max_load"] + 1e-9
        assert lay["optimized"]["bound"] <= lay["optimized"]["max_load"] + 1e-9
        ev = gpu_loads_from_phy2log(row, loads[2, i], 4)
        held = lay["optimized"]["held_out"]
        assert held["windows"] == [2]
        assert max(ev) == pytest.approx(held["summed"]["max_load"])
        assert max(ev) == pytest.approx(held["per_window"][0]["max_load"])
    assert rep["status"] in ("optimal", "feasible")
    assert set(rep["plan"]["summary"]) >= {"proven_optimal_layers", "trivial", "greedy", "optimized"}


def test_previous_placement_roundtrip_gives_zero_moves(tmp_path):
    rng = np.random.default_rng(3)
    # 8 experts per layer: small enough that the first run proves its plan optimal within its
    # deterministic work (no wall-clock limit: a 1 s guard cut the first run under parallel load,
    # and then the second run's cap, from a better max load, rightly moved experts)
    loads = (rng.lognormal(0, 1, (2, 8)) * 50).astype(int) + 1
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    inst = write_instance(tmp_path, "t.json", slots_per_gpu=3)
    code, first = run_json(inst, "--output", tmp_path / "o1")
    assert code == 0
    assert first["status"] == "optimal", first["solver"]  # the premise: nothing better to move to
    inst = write_instance(tmp_path, "t.json", slots_per_gpu=3, previous_placement="o1/placement.json",
                          max_load_tolerance=0.0)
    code, rep = run_json(inst, "--objective", "migration")
    assert code == 0
    assert all(lay["optimized"]["moves"] == 0 for lay in rep["plan"]["layers"])
    # wrong shape of the previous placement -> exit 2
    (tmp_path / "bad.json").write_text(json.dumps({"phy2log": [[0, 1, 2]]}))
    inst = write_instance(tmp_path, "t.json", slots_per_gpu=3, previous_placement="bad.json")
    code, out = run_cli(inst)
    assert code == 2 and "bad.json" in out and "wrong shape" in out


def test_infeasible_when_slots_exceed_experts(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps([[5, 3, 1]]))
    inst = write_instance(tmp_path, "t.json", num_gpus=2, num_nodes=1, slots_per_gpu=4)
    code, rep = run_json(inst)
    assert code == 3
    assert rep["status"] == "infeasible" and "gpu_slots" in {g["family"] for g in rep["conflicts"]}


def test_readme_command_runs(tmp_path):
    code, out = run_cli(REPO / "instances" / "deepseek_v3_ep32.yaml", "--time-limit", "2", "--output", tmp_path)
    assert code == 0
    assert "Busiest GPU per layer" in out and "balancedness" in out
    assert (tmp_path / "placement.json").exists()


def test_migration_keeps_a_previous_placement_that_meets_the_cap(tmp_path):
    """Large layers (LNS): rerunning with the placement just written as the previous one and the
    migration objective moves nothing, since that placement already meets the max-load cap."""
    import json
    import subprocess
    import sys

    from tests.conftest import INSTANCES, REPO

    inst = INSTANCES / "deepseek_v3_ep32.yaml"
    work = ["--set", "experts.work_units_per_layer=0.05"]  # still LNS on every layer; 10 s instead of 50 s
    first = subprocess.run([sys.executable, "-m", "optimizer.cli", str(inst), "--output", str(tmp_path),
                            "--format", "json", *work], capture_output=True, text=True, cwd=REPO)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([sys.executable, "-m", "optimizer.cli", str(inst), "--objective", "migration",
                            "--set", f"experts.previous_placement={tmp_path / 'placement.json'}", "--format", "json",
                            *work],
                           capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 0, again.stderr
    d = json.loads(again.stdout)
    layers = d["plan"]["layers"]
    assert all(lay["optimized"]["method"] == "lns" for lay in layers)  # the large-layer path
    assert d["objective"]["value"] == 0 and all(lay["optimized"]["moves"] == 0 for lay in layers)
    before = json.loads(first.stdout)["plan"]["layers"]
    assert [lay["optimized"]["max_load"] for lay in layers] == [lay["optimized"]["max_load"] for lay in before]


def test_pipeline_protocol_and_frozen_solution(tmp_path):
    """The experts problem is on the one pipeline (no old ``run``): its objective is an object,
    the solution is frozen, and the independent evaluation of the plan is the report's."""
    import dataclasses

    import optimizer.experts as pkg
    from optimizer.budget import Budget
    from optimizer.experts import PIPELINE
    from optimizer.problems import Pipeline, run_pipeline

    assert isinstance(PIPELINE, Pipeline) and not hasattr(pkg, "run")
    (tmp_path / "t.json").write_text(json.dumps([[[40, 30, 20, 10, 5, 5]]]))
    inst = write_instance(tmp_path, "t.json", num_gpus=2, num_nodes=1, slots_per_gpu=4)
    import yaml
    raw = yaml.safe_load(inst.read_text())
    data = PIPELINE.load(raw, inst, "max-load")
    assert data.objective.balances_load and not data.objective.covers_nodes
    sol = PIPELINE.solve(data, Budget.unlimited())
    with pytest.raises(dataclasses.FrozenInstanceError):
        sol.plan = None
    scores = PIPELINE.evaluate(data, sol.plan)
    rep = run_pipeline(PIPELINE, raw, inst, "max-load", Budget.unlimited())
    assert [s.max_load for s in scores] == [r.optimized.max_load for r in rep.rows]
    assert PIPELINE.build(data).named.keys  # the layer model names its constraints
