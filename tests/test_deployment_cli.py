"""The ``optimize`` CLI on deployment instances: README command, JSON, --set, exit codes,
one-line errors for bad input (exit 2) and conflicting constraints when infeasible (exit 3)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import INSTANCES, assert_one_line_error, shared

BOOK = INSTANCES / "qwen32b_128k.yaml"


def test_readme_main_command(cli):
    r = cli(BOOK, "--objective", "cost")
    assert r.exit_code == 0, r.output
    assert "optimal" in r.stdout and "0.238" in r.stdout
    assert "needs 102.03 GB per GPU > 80 GB" in r.stdout
    assert "gpus_per_server[server 0]" in r.stdout


def test_json_output(cli):
    r = cli(BOOK, "--format", "json")
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["status"] == "optimal"
    assert d["objective"]["name"] == "cost"
    assert round(d["objective"]["value"], 3) == 0.238
    assert [i["tp"] for i in d["plan"]["instances"]] == [2, 2, 2, 2]


def test_set_overrides(cli):
    r = cli(BOOK, "--format", "json", "--set", "deployment.tensor_parallel=[8]")
    d = json.loads(r.stdout)
    assert round(d["objective"]["value"], 3) == 0.439
    assert d["plan"]["on_time"] == 3
    r = cli(BOOK, "--format", "json", "--set", "faults=[{at_ms: 20, stall_ms: 40}]")
    d = json.loads(r.stdout)
    assert round(d["objective"]["value"], 3) == 0.478
    assert len(d["plan"]["fault_scenarios"]) == 8


@pytest.mark.parametrize("args,needles", [
    (["--set", "workload.sessions.0.count=0"], ["qwen32b_128k.yaml", "workload.sessions[0].count", "greater than 0"]),
    (["--set", "workload.sessions.0.context_tokens=-5"], ["workload.sessions[0].context_tokens"]),
    (["--set", "workload.sessions.0.count=four"], ["workload.sessions[0].count", "integer"]),
    (["--set", "workload.colour=red"], ["workload.colour", "unknown key"]),
    (["--set", "hardware.gpu=h900"], ["hardware.gpu", "unknown catalog name 'h900'"]),
    (["--set", "hardware.servers=0"], ["hardware.servers"]),
    (["--set", "model.config=nothere.json"], ["model.config", "file not found"]),
    (["--set", "hardware.gpu={name: x, memory_gb: 80}"], ["hardware.gpu.memory_bandwidth_gb_s", "missing"]),
    (["--set", "faults=[{gpu: 8, at_ms: 1, stall_ms: 1}]"], ["faults[0].gpu", "does not exist"]),
    (["--objective", "speed"], ["unknown objective 'speed'"]),
    (["--set", "deployment.allreduce=measured"], ["deployment.allreduce", "allreduce_log"]),
    # a fresh user's 50 x 100,000 sessions took 12 s to read before any check
    (["--set", "workload.sessions=[" + ", ".join(f"{{name: g{i}, context_tokens: 1000, new_tokens: 8, count: 100000}}"
                                                  for i in range(6)) + "]"],
     ["workload.sessions", "600,000 sessions in all; at most 500,000"]),
])
def test_bad_input(cli, args, needles):
    assert_one_line_error(cli(BOOK, *args), *needles)


def test_missing_instance_file(cli, tmp_path):
    assert_one_line_error(cli(tmp_path / "nope.yaml"), "nope.yaml", "file not found")


def test_malformed_yaml(cli, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: [1,\n")
    assert_one_line_error(cli(p), "bad.yaml", "not valid YAML")


def test_empty_objective_is_bad_input(cli):
    assert_one_line_error(cli(BOOK, "--objective", ""), "--objective", "empty")


def test_file_that_is_not_utf8(cli, tmp_path):
    """A Latin-1 file (or any binary) is bad input: one line, exit 2, not a decoding traceback."""
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"name: caf\xe9\n")
    assert_one_line_error(cli(p), "latin1.yaml", "byte 9", "not UTF-8")
    q = tmp_path / "nul.yaml"
    q.write_bytes(b"\0\0abc")
    out = cli(q)
    assert_one_line_error(out, "nul.yaml", "not valid YAML")
    assert "not valid YAML: not valid YAML" not in out.stderr


def _copy_book(tmp_path, config_text: str):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "qwen3-32b.json").write_text(config_text)
    p = tmp_path / "inst.yaml"
    shutil.copy(BOOK, p)
    return p


def test_malformed_config_json(cli, tmp_path):
    assert_one_line_error(cli(_copy_book(tmp_path, '{"hidden_size": 5120,')), "qwen3-32b.json", "not valid JSON")


def test_config_with_bad_field(cli, tmp_path):
    cfg = json.loads((INSTANCES / "models" / "qwen3-32b.json").read_text())
    cfg["num_hidden_layers"] = 0
    assert_one_line_error(cli(_copy_book(tmp_path, json.dumps(cfg))), "qwen3-32b.json", "num_hidden_layers", "positive")


def test_moe_config_without_experts_per_token_is_bad_input(cli, tmp_path):
    """MoE configs are modelled now (issue: models from HF config.json); one missing
    ``num_experts_per_tok`` is one line naming the field, exit 2."""
    src = shared("models", "Qwen--Qwen3-30B-A3B.config.json")
    cfg = json.loads(src.read_text())
    del cfg["num_experts_per_tok"]
    assert_one_line_error(cli(_copy_book(tmp_path, json.dumps(cfg))), "qwen3-32b.json", "num_experts_per_tok", "missing")


def test_moe_config_plans(cli, tmp_path):
    src = shared("models", "Qwen--Qwen3-30B-A3B.config.json")
    r = cli(_copy_book(tmp_path, src.read_text()), "--format", "json")
    assert r.exit_code == 0, r.output


def test_infeasible_names_conflicting_constraints(cli):
    r = cli(BOOK, "--set", "workload.sessions.0.deadline_ms=30", "--format", "json")
    assert r.exit_code == 3
    d = json.loads(r.stdout)
    assert d["status"] == "infeasible"
    fams = {g["family"] for g in d["conflicts"]}
    assert {"deadline", "on_time"} <= fams
    assert all(g["count"] == len(g["constraints"]) for g in d["conflicts"])
    assert len(fams) == len(d["conflicts"])  # one entry per family
    assert any("needs 41.176 ms > deadline 30 ms" in g["detail"] for g in d["conflicts"])
    # the best achievable value of the violated requirement leads the answer
    assert d["achievable"]["requirement"] == "on_time" and d["achievable"]["best"] == 0


def test_infeasible_by_memory(cli):
    r = cli(BOOK, "--set", "workload.sessions.0.count=40", "--set", "workload.min_on_time_fraction=0")
    assert r.exit_code == 3
    assert "memory[" in r.stdout and "assignment[" in r.stdout
    assert "best achievable" in r.stdout


def test_infeasible_when_no_degree_fits(cli):
    r = cli(BOOK, "--set", "deployment.tensor_parallel=[1]", "--format", "json")
    assert r.exit_code == 3
    d = json.loads(r.stdout)
    assert [g["constraints"] for g in d["conflicts"]] == [["memory[tp1]"]]
    assert d["achievable"]["requirement"] == "memory"


def test_tp_degree_must_split_the_heads(cli, tmp_path):
    """A listed degree that cannot split the heads is bad input (exit 2), as in
    ``deployment.layouts`` (it used to be a comparison row, and exit 3 when alone); a default
    degree that cannot (TP8 of a 12-head model) is only a ``heads`` comparison row."""
    assert_one_line_error(cli(BOOK, "--set", "deployment.tensor_parallel=[3, 4]"), "qwen32b_128k.yaml",
                          "deployment.tensor_parallel", "TP3 does not split 64 attention heads and 8 KV heads evenly")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768, "head_dim": 64,
           "intermediate_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4,
           "vocab_size": 32000, "max_position_embeddings": 8192}
    (tmp_path / "twelve.json").write_text(json.dumps(cfg))
    raw = yaml.safe_load(BOOK.read_text())
    raw["model"] = {"config": str(tmp_path / "twelve.json")}
    raw["workload"]["sessions"][0].update(context_tokens=4000, deadline_ms=None)
    del raw["deployment"]["tensor_parallel"]  # default degrees: 1, 2, 4, 8
    inst = tmp_path / "twelve.yaml"
    inst.write_text(yaml.safe_dump(raw))
    r = cli(inst, "--format", "json")
    assert r.exit_code == 0, r.output
    row = next(x for x in json.loads(r.stdout)["alternatives"] if x["option"] == "tp8")
    assert row["reason"] == "heads" and "do not split evenly over TP8" in row["detail"]


@pytest.mark.parametrize("args,needles", [
    (["--set", "workload.sessions.0.deadline_ms=.inf"], ["deadline_ms", "finite"]),
    (["--set", "workload.sessions.0.deadline_ms=1e15"], ["deadline_ms", "less than or equal"]),
    (["--set", "hardware.servers=1000000000"], ["hardware.servers", "less than or equal"]),
    (["--set", "faults=[{at_ms: 1e14, stall_ms: 1}]"], ["faults[0].at_ms"]),
    (["--time-limit", "nan"], ["--time-limit"]),
])
def test_out_of_range_numbers(cli, args, needles):
    assert_one_line_error(cli(BOOK, *args), *needles)


def test_scientific_notation_and_duplicate_keys(cli, tmp_path):
    r = cli(BOOK, "--format", "json", "--set", "workload.sessions.0.deadline_ms=1.3e2")
    assert r.exit_code == 0 and round(json.loads(r.stdout)["objective"]["value"], 3) == 0.238
    p = tmp_path / "dup.yaml"
    p.write_text("name: a\nname: b\n")
    assert_one_line_error(cli(p), "dup.yaml", "line 2", "given twice")


def test_output_folder_gets_result_json(cli, tmp_path):
    r = cli(BOOK, "--output", tmp_path / "out")
    assert r.exit_code == 0
    d = json.loads((tmp_path / "out" / "result.json").read_text())
    assert d["status"] == "optimal"


def test_console_usage_errors_are_one_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "optimizer.cli", str(BOOK), "--format", "xml"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--format" in r.stderr


ROOT = Path(__file__).resolve().parents[1]


def test_instance_generator_prints_yaml_and_refuses_bad_arguments():
    """``python -m benchmarks.gen_deployment``: a YAML instance the loader accepts; a bad
    argument is one usage line and exit 2 (it had been a ValueError traceback)."""
    ok = subprocess.run([sys.executable, "-m", "benchmarks.gen_deployment", "mixed", "5", "1", "--max-batch", "0"],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    raw = yaml.safe_load(ok.stdout)
    assert sum(s["count"] for s in raw["workload"]["sessions"]) == 5 and "max_batch" not in raw.get("deployment", {})
    bad = subprocess.run([sys.executable, "-m", "benchmarks.gen_deployment", "mixed", "many", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "SESSIONS" in bad.stderr


def test_sessions_beyond_kv_memory_get_a_number_and_a_server_count(cli):
    """200 sessions of 128K on one HGX H100 (the LP proves they cannot all be placed): the best
    achievable was prose only; now how many sessions' KV one layout holds on every GPU (a
    placement found) and the servers all of them need at least at that layout."""
    r = cli(BOOK, "--set", "workload.sessions.0.count=200", "--set", "workload.min_on_time_fraction=1",
            "--time-limit", "20", "--format", "json")
    assert r.exit_code == 3, r.output
    a = json.loads(r.stdout)["achievable"]
    assert a["requirement"] == "memory" and a["required"] == 200
    # TP8: 80 GB less 65.5 GB/8 of weights and 2 GiB reserve leaves 69.6 GB a GPU for 4.3 GB a session: 16
    assert a["best"] == 16
    assert "need at least 13 servers at TP8" in a["detail"]  # 200 x 34.4 GB / (8 x 69.6 GB) = 12.3
