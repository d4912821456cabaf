"""Real routing records (DeepSeek ESFT, ../shared/data/expert_load/esft); skipped when absent."""
import numpy as np
import pytest
import yaml

from optimizer.experts.traces import read_trace
from tests.experts_helpers import ESFT, run_json

pytestmark = pytest.mark.shared


def _esft(task):
    p = ESFT / task
    if not p.exists():
        pytest.skip(f"shared data not present: {p}")
    return p


@pytest.mark.parametrize("task,seqs,tokens", [("intent", 127, 8222), ("law", 33, 8327)])
def test_esft_trace_reads_as_topk(task, seqs, tokens):
    tr = read_trace(_esft(task), "auto", num_experts=64)
    assert tr.format == "topk" and tr.top_k == 6
    assert tr.loads.shape == (seqs, 26, 64)
    assert sum(tr.tokens_per_window) == tokens
    # every token is counted once at each of its 6 experts, in every layer
    assert (tr.loads.sum(axis=2) == np.asarray(tr.tokens_per_window)[:, None] * 6).all()
    assert tr.layer_names[:3] == ["1", "2", "3"]


def test_esft_fit_early_score_later(tmp_path):
    folder = _esft("law")
    inst = tmp_path / "esft.yaml"
    inst.write_text(yaml.safe_dump({"name": "esft law", "experts": {
        "trace": str(folder), "format": "topk", "num_experts": 64, "window_tokens": 1024,
        "num_gpus": 8, "num_nodes": 2, "slots_per_gpu": 10, "fit_windows": "first:4", "evaluate_windows": "rest"}}))
    code, rep = run_json(inst, "--time-limit", "1.5")
    assert code == 0
    assert rep["plan"]["trace"]["fitted_windows"] == [0, 1, 2, 3] and rep["plan"]["trace"]["evaluated_windows"] == [4, 5, 6, 7]
    for lay in rep["plan"]["layers"]:
        if not lay["optimized"]["greedy_colocated"]:
            assert lay["optimized"]["max_load"] <= lay["greedy"]["max_load"] + 1e-9
        held = lay["optimized"]["held_out"]
        assert held["windows"] == [4, 5, 6, 7] and [p["window"] for p in held["per_window"]] == [4, 5, 6, 7]
        assert held["worst_window"]["balancedness"] == min(p["balancedness"] for p in held["per_window"])
    s = rep["plan"]["summary"]
    assert s["optimized"]["mean_balancedness"] >= s["greedy"]["mean_balancedness"]
