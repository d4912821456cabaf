"""Trace readers: every format, and bad files -> exit code 2 with one line naming file and position."""
import json

import numpy as np
import pytest

from optimizer.errors import InputError
from optimizer.experts.traces import read_trace
from tests.experts_helpers import run_cli, write_instance

M2 = [[5, 0, 3, 2, 7, 1], [1, 1, 1, 9, 0, 4]]          # [layers, experts]
M3 = [M2, [[2, 2, 2, 2, 2, 2], [3, 0, 0, 0, 0, 9]]]     # [windows, layers, experts]


def _same(trace, arr):
    arr = np.asarray(arr)
    if arr.ndim == 2:
        arr = arr[None]
    assert trace.loads.tolist() == arr.tolist()


@pytest.mark.parametrize("data", [M2, M3])
def test_matrix_json(tmp_path, data):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    tr = read_trace(p)
    assert tr.format == "matrix"
    _same(tr, data)


@pytest.mark.parametrize("data", [M2, M3])
def test_matrix_npy(tmp_path, data):
    p = tmp_path / "t.npy"
    np.save(p, np.asarray(data))
    _same(read_trace(p), data)


def test_matrix_csv_with_header_and_windows(tmp_path):
    p = tmp_path / "t.csv"
    rows = ["e0,e1,e2,e3,e4,e5"] + [",".join(map(str, r)) for r in M3[0]] + [""] + [",".join(map(str, r)) for r in M3[1]]
    p.write_text("\n".join(rows) + "\n")
    _same(read_trace(p), M3)


def test_vllm(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"load_history": [{"logical_expert_load": w} for w in M3]}))
    tr = read_trace(p)
    assert tr.format == "vllm"
    _same(tr, M3)


@pytest.mark.parametrize("data", [M2, M3])
def test_sglang_json(tmp_path, data):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"logical_count": data}))
    tr = read_trace(p)
    assert tr.format == "sglang"
    _same(tr, data)


def test_sglang_pt_without_torch_is_a_clear_error(tmp_path):
    pytest.importorskip("pytest")
    try:
        import torch  # noqa: F401
        pytest.skip("torch installed: the .pt path is exercised instead by real dumps")
    except ImportError:
        pass
    p = tmp_path / "dump.pt"
    p.write_bytes(b"not really")
    with pytest.raises(InputError, match="needs torch"):
        read_trace(p)


def _topk_folder(tmp_path, lines_by_layer):
    d = tmp_path / "topk"
    d.mkdir()
    for layer, lines in lines_by_layer.items():
        (d / f"expert_weights_{layer}.txt").write_text("\n".join(lines) + "\n")
    return d


def _line(tokens):
    ids = "\t".join(str(e) for tok in tokens for e in tok)
    ws = "\t".join("0.5" for tok in tokens for _ in tok)
    return ids + "\t\t" + ws


def test_topk_windows_by_sequence_and_by_tokens(tmp_path):
    d = _topk_folder(tmp_path, {
        1: [_line([(0, 1), (2, 3)]), _line([(0, 2), (0, 3), (1, 3)])],
        2: [_line([(3, 1), (2, 0)]), _line([(1, 2), (0, 1), (1, 3)])],
    })
    tr = read_trace(d, num_experts=4)
    assert tr.format == "topk" and tr.top_k == 2 and tr.layer_names == ["1", "2"]
    assert tr.loads[0, 0].tolist() == [1, 1, 1, 1]
    assert tr.loads[1, 0].tolist() == [2, 1, 1, 2]
    tr2 = read_trace(d, num_experts=4, window_tokens=2)   # 5 tokens -> 2 windows of 2, 1 dropped
    assert tr2.loads.shape == (2, 2, 4)
    assert tr2.loads[1, 1].tolist() == [1, 2, 1, 0]       # tokens (1,2),(0,1) of layer 2


# ------------------------------------------------------------------ bad files via the CLI

def _cli_error(tmp_path, trace_name, **fields):
    inst = write_instance(tmp_path, trace_name, **fields)
    code, out = run_cli(inst)
    lines = [ln for ln in out.strip().splitlines() if ln]
    return code, lines


@pytest.mark.parametrize("name,content,expect", [
    ("ragged.json", [[1, 2, 3], [1, 2]], ["layer 1", "wrong shape"]),
    ("neg.json", [[1, 2, 3], [1, -4, 2]], ["layer 1, expert 1", "negative count"]),
    ("layers.json", {"load_history": [{"logical_expert_load": [[1, 2, 3], [1, 1, 1]]},
                                      {"logical_expert_load": [[1, 2, 3]]}]}, ["load_history[1]", "layers disagree"]),
    ("empty.json", [[[1, 2, 3], [1, 1, 1]], [[0, 0, 0], [0, 0, 0]]], ["window 1", "empty window"]),
    ("flat.json", [1, 2, 3], ["wrong shape"]),
    ("sg.json", {"logical_count": [[[1, 2], [3, 4]], [[1, 2]]]}, ["logical_count: window 1", "layers disagree"]),
])
def test_bad_json_traces_exit_2_one_line(tmp_path, name, content, expect):
    (tmp_path / name).write_text(json.dumps(content))
    code, lines = _cli_error(tmp_path, name)
    assert code == 2
    assert len(lines) == 1, lines
    assert name in lines[0]
    for e in expect:
        assert e in lines[0], lines[0]


def test_topk_id_out_of_range(tmp_path):
    d = _topk_folder(tmp_path, {1: [_line([(0, 1), (2, 9)])]})
    code, lines = _cli_error(tmp_path, d.name, num_experts=4)
    assert code == 2 and len(lines) == 1
    assert "expert_weights_1.txt" in lines[0] and "line 1" in lines[0] and "out of range" in lines[0]


def test_topk_layers_disagree(tmp_path):
    d = _topk_folder(tmp_path, {1: [_line([(0, 1)]), _line([(2, 3)])], 2: [_line([(0, 1)])]})
    code, lines = _cli_error(tmp_path, d.name, num_experts=4)
    assert code == 2 and len(lines) == 1 and "layers disagree" in lines[0]


def test_topk_empty_sequence(tmp_path):
    d = _topk_folder(tmp_path, {1: [_line([(0, 1)]), "", _line([(2, 3)])]})
    code, lines = _cli_error(tmp_path, d.name, num_experts=4)
    assert code == 2 and len(lines) == 1 and "line 2" in lines[0] and "empty" in lines[0]


def test_topk_weights_count_mismatch(tmp_path):
    d = _topk_folder(tmp_path, {1: ["0\t1\t\t0.5"]})
    code, lines = _cli_error(tmp_path, d.name, num_experts=4)
    assert code == 2 and "2 expert ids but 1 gate weights" in lines[0]


def test_csv_negative_and_npy_wrong_dims(tmp_path):
    (tmp_path / "a.csv").write_text("1,2,3\n4,-1,2\n")
    code, lines = _cli_error(tmp_path, "a.csv")
    assert code == 2 and "a.csv: layer 1, expert 1: negative count" in lines[0]
    np.save(tmp_path / "b.npy", np.ones((2, 2, 2, 2)))
    code, lines = _cli_error(tmp_path, "b.npy")
    assert code == 2 and "b.npy" in lines[0] and "4 dimensions" in lines[0]


def test_garbage_npy_and_a_folder_that_is_no_topk_trace(tmp_path):
    """A garbage .npy was answered with numpy's "pickled data" advice, and any folder (e.g. /tmp)
    with "num_experts: required": each now says what the input is not."""
    (tmp_path / "g.npy").write_bytes(b"garbage bytes here")
    code, lines = _cli_error(tmp_path, "g.npy")
    assert code == 2 and "not a .npy file (no NumPy header)" in lines[0] and "pickle" not in lines[0]
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("hello")
    code, lines = _cli_error(tmp_path, "stuff")
    assert code == 2 and "no expert_weights_<layer>.txt files in the folder" in lines[0]


def test_instance_errors(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps(M2))
    inst = write_instance(tmp_path, "t.json", slot_per_gpu=3)
    code, out = run_cli(inst)
    assert code == 2 and "experts.slot_per_gpu: unknown key" in out
    inst = write_instance(tmp_path, "t.json")
    code, out = run_cli(inst, "--objective", "latency")
    assert code == 2 and "unknown objective" in out
    code, out = run_cli(inst, "--objective", "migration")
    assert code == 2 and "previous_placement" in out
    inst = write_instance(tmp_path, "missing.json")
    code, out = run_cli(inst)
    assert code == 2 and "experts.trace: trace not found" in out and "missing.json" in out  # the field named too
    inst = write_instance(tmp_path, "t.json", num_gpus=2, slots_per_gpu=2)   # 4 slots < 6 experts
    code, out = run_cli(inst)
    assert code == 2 and "cannot hold 6 experts" in out
