"""Launch commands a cluster can run (issue #27 item 5): memory flags from the plan's KV, per-rank
flags, P/D ports, placement, router, deployment.json, Kubernetes manifests, and every flag
printed checked against the engine version's flag list (instances/engines)."""
from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import yaml

from optimizer.model.layout import Layout
from optimizer.serving.launch import Endpoint, flag_list, launch, memory_plan
from optimizer.serving.perf import Worker
from optimizer.serving import load_problem

INSTANCES = Path(__file__).resolve().parents[1] / "instances"


def _flags(cmd: str) -> list[str]:
    return [a.split("=", 1)[0] for a in shlex.split(cmd) if a.startswith("--")]


def _problem(name: str, **serving):
    raw = yaml.safe_load((INSTANCES / name).read_text())
    raw["serving"].update(serving)
    return load_problem(raw, INSTANCES / name, None)


def test_tp2_llama70b_prefill_gets_a_context_limit_and_a_kv_pool_that_start():
    p = _problem("serving_llama70b_h100.yaml")
    w = Worker("prefill", 0, Layout.tp(2), 2, max_batch=1)
    pm = p.pools[0].perf
    mem, weights, reserve = pm.hw.gpu.memory_bytes, pm.weight_bytes_per_gpu(w.layout), pm.reserve_bytes
    per_token = pm.kv_bytes_per_gpu(w.layout, 1, 0)
    # why the engines' defaults fail: vLLM 0.24's default 0.92 leaves far less KV than the model's 131,072 tokens
    default_tokens = (0.92 * mem - weights - reserve) / per_token
    assert 0 < default_tokens < 131_072
    cmd = launch(p, w, "vllm").command()
    args = shlex.split(cmd)
    assert args[args.index("--max-model-len") + 1] == str(p.traffic.max_len) == "2304"
    u = float(args[args.index("--gpu-memory-utilization") + 1])
    # vLLM's KV pool = U x memory - weights - activations (the reserve) holds the plan's prompt of 2,304 tokens
    assert u * mem - weights - reserve >= p.traffic.max_len * per_token
    assert u <= (mem - reserve) / mem
    sg = shlex.split(launch(p, w, "sglang").command())
    assert sg[sg.index("--context-length") + 1] == "2304"
    f = float(sg[sg.index("--mem-fraction-static") + 1])
    assert f * mem - weights >= p.traffic.max_len * per_token and mem * (1 - f) >= reserve * 0.99


def test_deepseek_v3_decode_max_num_seqs_is_per_dp_rank():
    p = _problem("serving_deepseek_v3_disagg.yaml")
    lay = Layout(attention_tp=1, attention_dp=8, experts_ep=8, experts_tp=1)
    w = Worker("decode", 0, lay, 8, max_batch=832)
    v = shlex.split(launch(p, w, "vllm").command())
    assert v[v.index("--max-num-seqs") + 1] == "104" and v[v.index("--data-parallel-size") + 1] == "8"
    s = shlex.split(launch(p, w, "sglang").command())
    assert s[s.index("--max-running-requests") + 1] == "832"  # SGLang divides it over the DP ranks itself
    # SGLang divides the chunk by the attention-DP size: the command carries chunk x DP
    assert s[s.index("--chunked-prefill-size") + 1] == str(p.chunk_tokens * 8)


def test_sglang_0523_uses_attn_dp_size():
    p = _problem("serving_deepseek_v3_disagg.yaml")
    import dataclasses

    p = dataclasses.replace(p, performance=dataclasses.replace(p.performance, engine="sglang", engine_version="0.5.23"))
    lay = Layout(attention_tp=1, attention_dp=8, experts_ep=8, experts_tp=1)
    cmd = launch(p, Worker("decode", 0, lay, 8, max_batch=832), "sglang").command()
    assert "--attn-dp-size 8" in cmd and "--enable-dp-attention" not in cmd and "--dp-size" not in cmd
    old = launch(_problem("serving_deepseek_v3_disagg.yaml"), Worker("decode", 0, lay, 8, max_batch=832), "sglang")
    assert "--dp-size 8 --enable-dp-attention" in old.command()


def test_pd_workers_get_cross_server_endpoints():
    p = _problem("serving_deepseek_v3_disagg.yaml")
    lay = Layout(attention_tp=1, attention_dp=8, experts_ep=8, experts_tp=1)
    end = Endpoint(port=30001, side_port=5608, bootstrap_port=8999, host="${SERVER_1_HOST}")
    pre = launch(p, Worker("prefill", 0, lay, 8, max_batch=8), "sglang", end).command()
    assert "--host 0.0.0.0" in pre and "--disaggregation-bootstrap-port 8999" in pre
    assert '--disaggregation-ib-device "${KV_NICS}"' in pre
    v = launch(p, Worker("prefill", 0, lay, 8, max_batch=8), "vllm", end)
    assert v.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "${SERVER_1_HOST}" and v.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5608"
    assert v.env["UCX_NET_DEVICES"] == "${KV_NICS}"


CASES = [  # (instance, --set overrides): aggregated, disaggregated, MoE + fp8, CP, fp8 KV
    ("serving_llama70b_h100.yaml", ()),
    ("serving_llama70b_h100.yaml", ("serving.mode=disaggregated",)),
    ("serving_deepseek_v3_disagg.yaml", ()),
    ("serving_qwen3_32b_long_prompt_cp.yaml", ()),
    ("serving_qwen3_30b_a3b_mixed_pools.yaml", ("model.kv_dtype=fp8",)),
]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    from click.testing import CliRunner

    from optimizer.cli import main

    out = {}
    for k, (name, sets) in enumerate(CASES):
        d = tmp_path_factory.mktemp(f"case{k}")
        args = [str(INSTANCES / name), "--output", str(d), "--deploy", "kubernetes"]
        for s in sets:
            args += ["--set", s]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        out[(name, sets)] = d
    return out


def test_every_printed_flag_exists_in_the_engine_version(outputs):
    seen = set()
    for d in outputs.values():
        dep = json.loads((d / "deploy" / "deployment.json").read_text())
        assert dep["engines"], d
        for engine, e in dep["engines"].items():
            have = flag_list(engine, e["version"])
            for row in e["workers"]:
                flags = _flags(row["command"])
                assert flags and set(flags) <= have, (engine, set(flags) - have)
                seen |= set(flags)
        res = json.loads((d / "result.json").read_text())
        for r in res["plan"]["rates"]:
            for m in r["modes"].values():
                for g in m.get("workers", []):
                    for engine, cmd in g["launch"].items():
                        assert set(_flags(cmd)) <= flag_list(engine, "0.24.0" if engine == "vllm" else "0.5.14")
    # the cases exercised every family of flags: P/D, MoE, CP, fp8, DP, memory
    for f in ("--kv-transfer-config", "--enable-expert-parallel", "--attn-cp-size", "--quantization", "--kv-cache-dtype",
              "--data-parallel-size", "--gpu-memory-utilization", "--mem-fraction-static", "--disaggregation-bootstrap-port"):
        assert f in seen, f


def test_a_flag_the_version_lacks_is_refused():
    from optimizer.serving.launch import Launch, UnknownFlag

    with pytest.raises(UnknownFlag, match="--attn-dp-size"):
        Launch("sglang", "0.5.14", ["python", "-m", "sglang.launch_server", "--attn-dp-size", "8"]).check()


def test_readme_disaggregated_example_scripts_have_distinct_ports_and_devices(outputs):
    d = outputs[("serving_llama70b_h100.yaml", ("serving.mode=disaggregated",))] / "deploy"
    dep = json.loads((d / "deployment.json").read_text())
    for engine, e in dep["engines"].items():
        rows = e["workers"]
        # the README's disaggregated plan: 2 prefill + 1 decode worker (3 prefill before the prefill
        # workers were sized as one shared queue), so one server holds several workers
        assert sorted(r["role"] for r in rows) == ["decode", "prefill", "prefill"]
        by_server: dict[int, list] = {}
        for r in rows:
            by_server.setdefault(r["server"], []).append(r)
            script = (d / engine / r["script"]).read_text()
            assert f"export CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']}" in script
        assert e["router"]["server"] == 0
        for s, rs in by_server.items():
            ports = [r["port"] for r in rs] + ([e["router"]["port"]] if s == 0 else [])
            assert len(ports) == len(set(ports)), (engine, s, ports)
            devs = [g for r in rs for g in r["devices"]]
            assert len(devs) == len(set(devs)) and max(devs) < 8
            side = [r.get("side_port", r.get("bootstrap_port")) for r in rs if r.get("side_port", r.get("bootstrap_port"))]
            assert len(side) == len(set(side))
        assert len(by_server) == 1  # 2 x TP2 prefill and the TP4 decode fill server 0 (first fit)
        router = (d / engine / "router.sh").read_text()
        for r in rows:
            assert f"{r['port']}" in router and f"SERVER_{r['server']}_HOST" in router


def test_kubernetes_manifests_parse_and_validate(outputs):
    kv = pytest.importorskip("kubernetes_validate")
    for d in outputs.values():
        for f in (d / "deploy").glob("kubernetes-*.yaml"):
            docs = [x for x in yaml.safe_load_all(f.read_text()) if x]
            assert docs
            for obj in docs:
                kv.validate(obj, "1.30.0", strict=True)
            gpus = [c["resources"]["limits"]["nvidia.com/gpu"] for o in docs if o["kind"] == "StatefulSet"
                    for c in o["spec"]["template"]["spec"]["containers"]]
            assert gpus and all(isinstance(g, int) and g >= 1 for g in gpus)
            names = [(o["kind"], o["metadata"]["name"]) for o in docs]
            assert len(names) == len(set(names))


def test_deploy_needs_output(cli):
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--deploy", "kubernetes")
    assert r.exit_code != 0 and "--deploy" in r.output and "--output" in r.output


def test_memory_plan_is_at_least_what_the_plan_assumed():
    p = _problem("serving_llama70b_h100.yaml")
    w = Worker("decode", 0, Layout.tp(4), 4, max_batch=64)
    m = memory_plan(p, w)
    pm = p.pools[0].perf
    need = 64 * pm.kv_bytes_per_gpu(w.layout, math.ceil(p.traffic.mean_isl), math.ceil(p.traffic.mean_osl))
    mem = pm.hw.gpu.memory_bytes
    assert m["vllm"] * mem - pm.weight_bytes_per_gpu(w.layout) - pm.reserve_bytes >= need
    assert not m["capped"] and re.fullmatch(r"0\.\d\d", f"{m['vllm']:.2f}")


def test_every_engine_pod_gets_shared_memory_and_the_token_secret(outputs):
    """NCCL between a pod's GPUs needs /dev/shm beyond the pod's 64 MiB default: every engine
    container mounts a memory-backed emptyDir there, and reads HF_TOKEN from an optional Secret."""
    for d in outputs.values():
        for f in (d / "deploy").glob("kubernetes-*.yaml"):
            for o in (x for x in yaml.safe_load_all(f.read_text()) if x and x["kind"] == "StatefulSet"):
                spec = o["spec"]["template"]["spec"]
                assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in spec["volumes"]
                for c in spec["containers"]:
                    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
                    assert any(e["name"] == "HF_TOKEN" and e["valueFrom"]["secretKeyRef"]["optional"] for e in c["env"])


def test_day_plan_deploys_each_window(cli, tmp_path):
    """`--deploy kubernetes` on a day plan crashed (the day report had no placements); now each
    window of the schedule gets its own deploy folder with valid manifests, one StatefulSet
    replica per worker of that window."""
    kv = pytest.importorskip("kubernetes_validate")
    r = cli(INSTANCES / "serving_llama70b_day_windows.yaml", "--output", tmp_path, "--deploy", "kubernetes",
            "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    folders = sorted(tmp_path.glob("deploy_*"))
    assert folders and (tmp_path / "result.json").exists()
    for f in folders:
        man = f / "kubernetes-vllm.yaml"
        docs = [x for x in yaml.safe_load_all(man.read_text()) if x]
        for obj in docs:
            kv.validate(obj, "1.30.0", strict=True)
        placed = json.loads((f / "deployment.json").read_text())
        n = len({w["worker"] for w in placed["engines"]["vllm"]["workers"]})
        assert sum(o["spec"]["replicas"] for o in docs if o["kind"] == "StatefulSet") == n
    assert d["status"] in ("optimal", "feasible")


def test_pareto_with_deploy_is_refused(cli, tmp_path):
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--pareto", "tpot", "--output", tmp_path, "--deploy", "kubernetes")
    assert r.exit_code == 2 and "--deploy" in r.output and "--pareto" in r.output


def test_eagle_without_a_draft_model_says_so():
    """EAGLE without ``draft_hf_id`` printed the placeholder DRAFT_MODEL in the commands with no
    word of it; the worker's launch notes now say to replace it (and say nothing once it is given)."""
    from optimizer.serving.launch import launch_notes

    w = Worker("decode", 0, Layout.tp(4), 4, max_batch=16)
    p = _problem("serving_llama70b_h100.yaml", speculative={"method": "eagle", "tokens": 2, "acceptance": 0.7})
    assert any("DRAFT_MODEL" in n and "draft_hf_id" in n for n in launch_notes(p, w))
    q = _problem("serving_llama70b_h100.yaml", speculative={"method": "eagle", "tokens": 2, "acceptance": 0.7,
                                                            "draft_hf_id": "yuhuili/EAGLE-X"})
    assert not any("DRAFT_MODEL" in n for n in launch_notes(q, w))
