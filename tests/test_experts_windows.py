"""Window labels: explicit window-index lists in JSON, table columns named by what was scored,
held-out windows scored summed and one by one (with the worst window)."""
import json
from pathlib import Path

import numpy as np
import pytest

from optimizer.errors import InputError
from optimizer.experts.problem import select_windows
from tests.experts_helpers import gpu_loads_from_phy2log, run_cli, run_json, write_instance


@pytest.mark.parametrize("n,fit,ev,fitted,held", [
    (6, "all", "next", [0, 1, 2, 3, 4], [5]),
    (6, "all", "rest", [0, 1, 2, 3, 4], [5]),        # 'rest' after 'all' is still one window
    (6, "all", "none", [0, 1, 2, 3, 4, 5], None),
    (6, "first:2", "next", [0, 1], [2]),
    (6, "first:2", "rest", [0, 1], [2, 3, 4, 5]),
    (6, "last:2", "rest", [3, 4], [5]),
    (6, "first:6", "rest", [0, 1, 2, 3, 4, 5], None),
    (1, "all", "next", [0], None),
])
def test_select_windows_lists(n, fit, ev, fitted, held):
    w = select_windows(n, fit, ev, Path("i.yaml"))
    assert w.fit == fitted and w.evaluate == held


def test_select_windows_too_many():
    with pytest.raises(InputError):
        select_windows(3, "last:3", "next", Path("i.yaml"))


def _trace(tmp_path, seed=9):
    rng = np.random.default_rng(seed)
    loads = (rng.lognormal(0, 1, (5, 2, 8)) * 40).astype(int) + 1   # [windows, layers, experts]
    loads[3] *= 3                                                    # a window with more tokens
    (tmp_path / "t.json").write_text(json.dumps(loads.tolist()))
    return loads


def test_rest_scores_summed_and_per_window(tmp_path):
    loads = _trace(tmp_path)
    inst = write_instance(tmp_path, "t.json", num_gpus=4, num_nodes=2, slots_per_gpu=3,
                          fit_windows="first:2", evaluate_windows="rest", work_units_per_layer=0.2)
    code, rep = run_json(inst, "--output", tmp_path / "out")
    assert code == 0
    assert rep["plan"]["trace"]["fitted_windows"] == [0, 1] and rep["plan"]["trace"]["evaluated_windows"] == [2, 3, 4]
    pl = json.loads((tmp_path / "out" / "placement.json").read_text())
    for i, lay in enumerate(rep["plan"]["layers"]):
        held = lay["optimized"]["held_out"]
        row = pl["phy2log"][i]
        summed = gpu_loads_from_phy2log(row, loads[2:, i].sum(axis=0), 3)
        assert held["summed"]["max_load"] == pytest.approx(max(summed))
        per = []
        for k, entry in zip((2, 3, 4), held["per_window"]):
            ld = gpu_loads_from_phy2log(row, loads[k, i], 3)
            assert entry["window"] == k and entry["max_load"] == pytest.approx(max(ld))
            per.append((np.mean(ld) / max(ld), k))
        worst_bal, worst_k = min(per)
        assert held["worst_window"]["window"] == worst_k
        assert held["worst_window"]["balancedness"] == pytest.approx(worst_bal)
    s = rep["plan"]["summary"]["optimized"]["held_out"]
    assert s["windows"] == [2, 3, 4]
    assert s["worst_window_mean_balancedness"] <= s["summed_mean_balancedness"] + 1e-12
    code, out = run_cli(inst, "--time-limit", "30")
    assert code == 0
    flat = " ".join(out.split())
    assert "Held out: windows 2-4, balancedness of their summed loads and of the worst single window" in flat
    assert "fitted on windows 0-1 (summed); held out: windows 2-4" in flat
    assert "(window 2)" in flat or "(window 3)" in flat or "(window 4)" in flat
    assert "next" not in out


def test_all_rest_is_labelled_by_window_not_next(tmp_path):
    _trace(tmp_path)
    inst = write_instance(tmp_path, "t.json", num_gpus=4, num_nodes=2, slots_per_gpu=3,
                          evaluate_windows="rest", work_units_per_layer=0.2)
    code, out = run_cli(inst)
    assert code == 0
    flat = " ".join(out.split())
    assert "Held out: window 4, balancedness" in flat and "held out: window 4" in flat
    assert "next" not in out and "worst" not in out and "summed windows" not in flat
