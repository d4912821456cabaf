"""Launch commands of deployment plans (optimizer/deployment/launch.py on optimizer/launch.py):
the layout -> flags mapping per engine (dense TP, PP, MoE EP with DP attention, several servers),
the notes for layouts an engine cannot run, every printed flag in its version's flag list, the
memory fractions against the plan's memory, the JSON ``launch`` per instance and ``--output``."""
from __future__ import annotations

import json
import shlex

import pytest

from optimizer.launch import (DEFAULT_VERSION, Launch, Nodes, UnknownFlag, flag_list, layout_note, memory_fractions,
                              parallel_args)
from optimizer.model.layout import Layout
from tests.conftest import INSTANCES

QWEN32B = INSTANCES / "qwen32b_two_servers.yaml"
QWEN235B = INSTANCES / "qwen3_235b_hgx_h100.yaml"


def _args(engine, lay, moe=False, nodes=Nodes(), version=None):
    return parallel_args(engine, lay, moe, flag_list(engine, version or DEFAULT_VERSION[engine]), nodes)[0]


def _flags(cmd: str) -> list[str]:
    return [a.split("=", 1)[0] for a in shlex.split(cmd) if a.startswith("--")]


def _opt(cmd: str, flag: str) -> str:
    a = shlex.split(cmd)
    return a[a.index(flag) + 1]


# ------------------------------------------------------------------ the mapping
def test_dense_tp():
    assert _args("vllm", Layout.tp(4)) == ["--tensor-parallel-size", "4"]
    assert _args("sglang", Layout.tp(4)) == ["--tp-size", "4"]


def test_pipeline_stages():
    lay = Layout(4, 1, 4, 1, pp=2)
    assert _args("vllm", lay) == ["--tensor-parallel-size", "4", "--pipeline-parallel-size", "2"]
    assert _args("sglang", lay) == ["--tp-size", "4", "--pp-size", "2"]  # --tp-size: the GPUs of one stage


def test_moe_ep_with_dp_attention():
    lay = Layout(1, 8, 1, 8)  # TP1xDP8/EP8
    assert lay.label() == "TP1xDP8/EP8"
    assert _args("vllm", lay, moe=True) == ["--tensor-parallel-size", "1", "--data-parallel-size", "8",
                                            "--enable-expert-parallel"]
    assert _args("sglang", lay, moe=True) == ["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention",
                                              "--ep-size", "8"]
    # SGLang 0.5.23 deprecates --dp-size/--enable-dp-attention for --attn-dp-size (its flag list decides)
    assert _args("sglang", lay, moe=True, version="0.5.23") == ["--tp-size", "8", "--attn-dp-size", "8", "--ep-size", "8"]


def test_hybrid_experts_have_no_vllm_command():
    lay = Layout(2, 4, 2, 4)  # TP2xDP4/EP4xTP2: SGLang --tp 8 --ep 4 gives experts TP 8/4 = 2
    assert _args("sglang", lay, moe=True) == ["--tp-size", "8", "--dp-size", "4", "--enable-dp-attention",
                                              "--ep-size", "4"]
    assert "EP4 x TP2" in layout_note("vllm", lay, True)
    assert layout_note("sglang", lay, True) is None
    assert layout_note("vllm", Layout(4, 2, 8, 1), True) is None  # experts TP over TP x DP: vLLM's default


def test_cp_decode_gets_notes():
    lay = Layout(2, 1, 2, 1, cp=4)
    assert "--decode-context-parallel-size" in layout_note("vllm", lay, False)
    assert "--dcp-size" in layout_note("sglang", lay, False)
    assert layout_note("sglang", lay, False, role="prefill") is None  # serving's prefill CP stays


def test_several_servers():
    head = "${SERVER_0_HOST}"
    tp16 = Layout.tp(16)
    assert _args("vllm", tp16, nodes=Nodes(2, 1, head, 29501))[2:] == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", head, "--master-port", "29501", "--headless"]
    assert _args("vllm", tp16, nodes=Nodes(2, 0, head, 29501))[-1] == "29501"  # the head node serves HTTP
    assert _args("sglang", tp16, nodes=Nodes(2, 1, head, 29500))[2:] == [
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", f"{head}:29500"]
    dp = Layout(2, 8, 1, 16)  # DP over servers: 4 DP ranks of 2 GPUs per 8-GPU server
    assert _args("vllm", dp, True, Nodes(2, 1, head, 29550))[-9:] == [
        "--data-parallel-size-local", "4", "--data-parallel-address", head, "--data-parallel-rpc-port", "29550",
        "--headless", "--data-parallel-start-rank", "4"]
    assert "--headless" not in _args("vllm", dp, True, Nodes(2, 0, head, 29550))
    assert layout_note("vllm", dp, True, gpus_per_node=8, nodes=2) is None
    assert layout_note("vllm", Layout(16, 2, 32, 1), True, gpus_per_node=8, nodes=4) is not None  # a rank > a server


def test_memory_fractions():
    gib = 2 ** 30
    fr = memory_fractions(80e9, 30e9, 2 * gib)  # vLLM holds the reserve too, SGLang's static pool not
    assert fr == {"vllm": 0.41, "sglang": 0.38, "capped": False}
    capped = memory_fractions(80e9, 79e9, 2 * gib)
    assert capped["capped"] and capped["vllm"] == 0.97


def test_unknown_flag_is_caught():
    with pytest.raises(UnknownFlag, match="--attn-dp-size"):
        Launch("sglang", "0.5.14", ["python", "--attn-dp-size", "2"]).check()


# ------------------------------------------------------------------ the plans' commands
def _json(cli, path, *args):
    r = cli(path, "--format", "json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _check_all_flags(d):
    for inst in d["plan"]["instances"]:
        for node in inst["launch_nodes"]:
            for engine, cmd in node["commands"].items():
                assert set(_flags(cmd)) <= flag_list(engine, DEFAULT_VERSION[engine]), cmd


def test_json_has_launch_per_instance_and_the_plan_in_it(cli):
    d = _json(cli, QWEN32B)
    p = d["plan"]
    assert p["launch"]["versions"] == DEFAULT_VERSION
    sessions = {s["id"]: s for s in p["sessions"]}
    for inst in p["instances"]:
        assert set(inst["launch"]) == {"vllm", "sglang"}, inst.get("launch_notes")
        v, s = inst["launch"]["vllm"], inst["launch"]["sglang"]
        assert _opt(v, "--tensor-parallel-size") == _opt(s, "--tp-size") == str(inst["layout"]["attention"]["tp"])
        assert _opt(v, "--max-num-seqs") == _opt(s, "--max-running-requests") == str(inst["max_batch"])
        # the GPUs the plan gives it (global id = server x 8 + local)
        assert v.startswith(f"CUDA_VISIBLE_DEVICES={','.join(str(g % 8) for g in inst['gpus'])} vllm serve")
        # the longest session it serves, with the YaRN scaling passed on
        groups = {"longctx": 131072, "rag": 32800, "chat": 4160, "batch": 8320}
        assert int(_opt(v, "--max-model-len")) == max(groups[x.split("/")[0]] for x in inst["sessions"])
        assert json.loads(_opt(v, "--hf-overrides"))["rope_scaling"]["factor"] == 4
        # the fractions hold the plan's memory per GPU (vLLM all of it, SGLang less the 2 GiB reserve)
        gb = inst["memory_gb_per_gpu"]
        assert float(_opt(v, "--gpu-memory-utilization")) * 80 >= gb > (float(_opt(v, "--gpu-memory-utilization")) - .01) * 80
        assert float(_opt(s, "--mem-fraction-static")) * 80 >= gb - 2 * 2 ** 30 / 1e9
        assert all(x in sessions for x in inst["sessions"])
    ports = [(i["server"], _opt(i["launch"]["vllm"], "--port")) for i in p["instances"]]
    assert len(set(ports)) == len(ports)  # replicas sharing a server get their own ports
    _check_all_flags(d)


def test_moe_layouts_in_the_plan(cli):
    d = _json(cli, QWEN235B, "--set", "deployment.layouts=[{attention: {tp: 1, dp: 8}, experts: {tp: 1, ep: 8}}]")
    inst = d["plan"]["instances"][0]
    assert "--data-parallel-size 8 --enable-expert-parallel" in inst["launch"]["vllm"]
    assert _opt(inst["launch"]["vllm"], "--max-num-seqs") == "2"  # 16 sessions over 8 DP ranks
    assert "--ep-size 8" in inst["launch"]["sglang"] and _opt(inst["launch"]["sglang"], "--max-running-requests") == "16"
    _check_all_flags(d)
    d = _json(cli, QWEN235B, "--set", "deployment.layouts=[{attention: {tp: 2, dp: 4}, experts: {tp: 2, ep: 4}}]")
    inst = d["plan"]["instances"][0]
    assert set(inst["launch"]) == {"sglang"} and "EP4 x TP2" in inst["launch_notes"][0]


def test_multi_server_replica(cli):
    d = _json(cli, QWEN32B, "--set", "deployment.tensor_parallel=[16]", "--set", "workload.min_on_time_fraction=0")
    inst = d["plan"]["instances"][0]
    nodes = inst["launch_nodes"]
    assert [n["server"] for n in nodes] == [0, 1] and all(n["cuda_visible_devices"] == "0,1,2,3,4,5,6,7" for n in nodes)
    assert "--headless" not in nodes[0]["commands"]["vllm"] and "--headless" in nodes[1]["commands"]["vllm"]
    assert [_opt(n["commands"]["sglang"], "--node-rank") for n in nodes] == ["0", "1"]
    assert _opt(nodes[1]["commands"]["sglang"], "--dist-init-addr") == "${SERVER_0_HOST}:29500"
    _check_all_flags(d)


def test_output_writes_the_scripts(cli, tmp_path):
    r = cli(QWEN32B, "--output", tmp_path)
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "deploy" / "deployment.json").read_text())
    assert len(doc["replicas"]) == len(json.loads((tmp_path / "result.json").read_text())["plan"]["instances"])
    for rep in doc["replicas"]:
        for node in rep["nodes"]:
            for engine, rel in node["scripts"].items():
                text = (tmp_path / "deploy" / rel).read_text()
                assert f"export CUDA_VISIBLE_DEVICES={node['cuda_visible_devices']}\n" in text
                assert text.rstrip().endswith(node["commands"][engine].split(" ", 1)[1])
    assert "wrote " + str(tmp_path / "deploy" / "deployment.json") in r.stderr


def test_text_report_has_the_section(cli):
    r = cli(QWEN235B)
    assert r.exit_code == 0
    out = r.stdout
    assert "Launch commands (vLLM 0.24.0, SGLang 0.5.14" in out
    assert "[i0 TP8, server 0] CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 vllm serve MODEL --tensor-parallel-size 8" in out
