"""Deterministic by default: two runs of one instance give identical JSON and placement files
except the timing fields; the wall-clock ``--time-limit`` is only a guard, flagged when hit."""
import json

import numpy as np

from tests.experts_helpers import run_json, v3_loads, write_instance

TIMING = {"time_s", "solve_time_s"}


def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in TIMING}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def _twice(tmp_path, inst, *args):
    outs = []
    for _ in range(2):  # same output folder, so the listed output paths agree too
        code, rep = run_json(inst, "--output", tmp_path / "out", *args)
        assert code == 0
        files = {n: (tmp_path / "out" / n).read_text() for n in ("placement.json", "sglang_expert_location.json")}
        outs.append((rep, files))
    return outs


def test_readme_sized_instance_twice_identical(tmp_path):
    """256 experts on 32 GPUs x 9 slots, 4 nodes, 8 groups (the README example's shape), two
    layers solved by LNS on two processes, with a held-out window."""
    loads = np.stack([v3_loads(seed=s, layers=2, tokens=4096) for s in (1, 2)])  # [windows, layers, experts]
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    inst = write_instance(tmp_path, "t.json", num_gpus=32, num_nodes=4, num_groups=8, slots_per_gpu=9,
                          work_units_per_layer=0.3)
    (a, fa), (b, fb) = _twice(tmp_path, inst)
    assert a["plan"]["layers"][0]["optimized"]["method"] == "lns"
    assert a["plan"]["summary"]["reproducible"] is True
    assert a["plan"]["summary"]["optimized"]["sum_max_load"] < a["plan"]["summary"]["greedy"]["sum_max_load"]
    assert _strip(a) == _strip(b)
    assert fa == fb


def test_small_exact_layers_twice_identical(tmp_path):
    rng = np.random.default_rng(4)
    loads = (rng.lognormal(0, 1.2, (3, 3, 12)) * 80).astype(int) + 1
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    inst = write_instance(tmp_path, "t.json", num_gpus=4, num_nodes=2, slots_per_gpu=4, evaluate_windows="rest",
                          fit_windows="first:1", work_units_per_layer=0.05)
    (a, fa), (b, fb) = _twice(tmp_path, inst, "--objective", "inter-node")
    assert a["plan"]["layers"][0]["optimized"]["method"] in ("exact", "exact+lns", "start at bound")
    assert a["plan"]["trace"]["evaluated_windows"] == [1, 2]
    assert _strip(a) == _strip(b)
    assert fa == fb


def test_wall_clock_guard_is_flagged(tmp_path):
    loads = v3_loads(seed=3, layers=1, tokens=4096)
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    inst = write_instance(tmp_path, "t.json", num_gpus=32, num_nodes=4, num_groups=8, slots_per_gpu=9,
                          work_units_per_layer=50.0, evaluate_windows="none")
    code, rep = run_json(inst, "--time-limit", "0.3")
    assert code == 0
    assert rep["plan"]["summary"]["reproducible"] is False
    assert rep["plan"]["layers"][0]["optimized"]["reproducible"] is False
    assert any("wall-clock" in n for n in rep["plan"]["layers"][0]["optimized"]["notes"])
    assert rep["plan"]["layers"][0]["optimized"]["work"] < 50.0


def test_bad_work_limit_is_one_line_exit_2(tmp_path):
    from tests.experts_helpers import run_cli

    (tmp_path / "t.json").write_text(json.dumps([[5, 3, 1, 2]]))
    inst = write_instance(tmp_path, "t.json", num_gpus=2, num_nodes=1, slots_per_gpu=2, work_units_per_layer=0)
    code, out = run_cli(inst)
    assert code == 2
    assert "work_units_per_layer" in out and "inst.yaml" in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_secondary_objective_text_names_whose_gap_the_table_shows(tmp_path):
    """With --objective inter-node the table's bound and gap are the max load's (a fresh user read
    the 0.00 % column as the objective's gap, which the JSON left null): the column says so and a
    line gives the objective's own value and bound, as in the JSON."""
    from tests.experts_helpers import run_cli

    rng = np.random.default_rng(4)
    loads = (rng.lognormal(0, 1.2, (2, 2, 12)) * 80).astype(int) + 1
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    inst = write_instance(tmp_path, "t.json", num_gpus=4, num_nodes=2, slots_per_gpu=4, work_units_per_layer=0.2)
    code, text = run_cli(inst, "--objective", "inter-node", "--output", tmp_path / "out")  # one run: text and result.json
    assert code == 0, text
    d = json.loads((tmp_path / "out" / "result.json").read_text())
    o = d["objective"]
    assert "max-load gap" in text and "mean max-load gap" in " ".join(text.split())
    line = next(x for x in text.splitlines() if x.startswith("objective inter-node:"))
    assert f"{o['value']:.6g} tokens crossing nodes" in line
    assert (f"bound {o['bound']:.6g}" in line) if o["bound"] is not None else ("not proven" in line)
    code, text = run_cli(inst)
    assert code == 0 and "max-load gap" not in text and "objective max-load:" not in text


def test_inter_node_on_one_node_is_proven_at_zero(tmp_path):
    """One node: no token crosses nodes; the objective's bound was null ("not proven") at 0."""
    rng = np.random.default_rng(5)
    loads = (rng.lognormal(0, 1.2, (1, 2, 12)) * 80).astype(int) + 1
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    inst = write_instance(tmp_path, "t.json", num_gpus=4, num_nodes=1, slots_per_gpu=4, work_units_per_layer=0.2)
    code, d = run_json(inst, "--objective", "inter-node")
    assert code == 0 and d["objective"]["value"] == 0 and d["objective"]["bound"] == 0 and d["objective"]["gap"] == 0
