"""Serving CLI: bad input (one line, exit 2 or 3), traces (Azure columns load as they are), --output scripts."""
from __future__ import annotations

import json

import pytest

from optimizer.serving.schema import read_trace
from tests.conftest import assert_one_line_error, shared
from tests.serving_helpers import INSTANCES, llama70b_raw, llama8b_raw, write


def test_negative_rate(cli, tmp_path):
    raw = llama8b_raw(-1.0, 512, 128, 1000, 50)
    assert_one_line_error(cli(write(tmp_path, raw)), "serving.traffic.rate_rps", "positive")


def test_tpot_below_the_batch1_step_is_infeasible_with_that_reason(cli, tmp_path):
    raw = llama70b_raw(simulation={"enabled": False})
    raw["serving"]["slo"]["tpot_ms"] = 2.0
    r = cli(write(tmp_path, raw), "--format", "json")
    assert r.exit_code == 3, r.output
    d = json.loads(r.stdout)
    assert "tpot" in {c["family"] for c in d["conflicts"]}
    details = " ".join(x for c in d["conflicts"] for x in c["details"])
    assert "batch-1 step" in details and "> TPOT 2 ms" in details
    r2 = cli(write(tmp_path, raw, "t.yaml"))
    assert r2.exit_code == 3 and "tpot[" in r2.stdout


def test_trace_with_missing_columns(cli, tmp_path):
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n")
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    raw["serving"]["traffic"] = {"trace": str(tmp_path / "t.csv")}
    assert_one_line_error(cli(write(tmp_path, raw)), "t.csv", "missing columns")


def test_trace_with_a_bad_line(cli, tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n0.5,abc,10\n")
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    raw["serving"]["traffic"] = {"trace": str(tmp_path / "t.csv")}
    assert_one_line_error(cli(write(tmp_path, raw)), "t.csv", "line 3")


def test_trace_requests_without_a_decode_are_counted_with_a_warning(cli, tmp_path):
    """Output tokens 0 or 1 were raised to 2 silently: now said on stderr (the run goes on)."""
    (tmp_path / "t.csv").write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n0.5,100,0\n1.0,0,1\n")
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    raw["serving"]["traffic"] = {"trace": str(tmp_path / "t.csv")}
    r = cli(write(tmp_path, raw), "--format", "json")
    assert r.exit_code == 0, r.output
    assert "2 of 3 requests with fewer than 2 output tokens counted as 2" in r.stderr
    assert "input_tokens: 1 of 3 requests with no input tokens counted as 1" in r.stderr


def test_unknown_pool_gpu(cli, tmp_path):
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    raw["hardware"] = {"pools": [{"gpu": "h100-sxm", "server": "hgx-h100", "count": 8},
                                 {"gpu": "x999", "server": "hgx-h100", "count": 8}]}
    assert_one_line_error(cli(write(tmp_path, raw)), "hardware.pools[1].gpu", "unknown catalog name 'x999'")


@pytest.mark.parametrize("change,needles", [
    (lambda r: r["serving"]["traffic"].pop("osl"), ("serving.traffic.osl", "missing")),
    (lambda r: r["serving"]["traffic"].update(classes=[{"isl": 10, "osl": 5, "share": 1.0}]), ("serving.traffic", "exactly one")),
    (lambda r: r["serving"]["slo"].update(attainment=1.5), ("serving.slo.attainment",)),
    (lambda r: r["serving"].update(mode="split"), ("serving.mode",)),
    (lambda r: r["serving"]["traffic"].update(isl=200_000), ("serving.traffic", "maximum length")),
    (lambda r: r["serving"].update(bogus=1), ("serving.bogus", "unknown key")),
    # a fresh user's TP3 prefill went through as "disaggregated: no plan ()"; deployment calls it bad input too
    (lambda r: r["serving"].update(prefill={"tp": [3]}), ("serving.prefill.tp", "TP3 does not split 32 attention heads")),
    (lambda r: r["serving"].update(objective="gpu"), ("serving.objective", "unknown objective 'gpu'")),
    # a million servers ran 108 s past a 10 s limit; deployment caps servers at 4,096, and so does serving
    (lambda r: r["hardware"].update(servers=1_000_000), ("hardware.servers", "more than 4096 servers")),
    (lambda r: r.update(hardware={"pools": [{"gpu": "h100-sxm", "server": "hgx-h100", "count": 40_000}]}),
     ("hardware.pools[0].count", "more than 4096 servers")),
])
def test_bad_fields(cli, tmp_path, change, needles):
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    change(raw)
    assert_one_line_error(cli(write(tmp_path, raw)), *needles)


def test_class_shares_must_add_up(cli, tmp_path):
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    raw["serving"]["traffic"] = {"rate_rps": 1.0, "classes": [{"isl": 100, "osl": 10, "share": 0.5},
                                                              {"isl": 200, "osl": 20, "share": 0.4}]}
    assert_one_line_error(cli(write(tmp_path, raw)), "serving.traffic.classes", "add up to 1")


def test_unknown_objective_and_dollars_without_price(cli, tmp_path):
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    assert_one_line_error(cli(write(tmp_path, raw), "--objective", "speed"), "--objective", "unknown objective")
    raw["hardware"] = {"gpu": "b200", "server": "dgx-b200", "servers": 1}
    assert_one_line_error(cli(write(tmp_path, raw), "--objective", "dollars"), "dollars_per_gpu_hour")


def test_own_trace_columns_and_rate_scaling(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n1.0,200,1\n2.0,300,30\n")
    t, isl, osl = read_trace(tmp_path / "t.csv", "serving.traffic.trace", tmp_path / "i.yaml")
    assert list(t) == [0.0, 1.0, 2.0] and list(isl) == [100, 200, 300] and list(osl) == [10, 2, 30]


@pytest.mark.shared
def test_azure_trace_loads_as_is(cli, tmp_path):
    path = shared("serving", "azure-llm-2023", "AzureLLMInferenceTrace_conv.csv")
    t, isl, osl = read_trace(path, "serving.traffic.trace", tmp_path / "i.yaml")
    assert len(t) == 19366 and t[0] == 0.0 and (t[1:] >= t[:-1]).all()
    assert isl[0] == 374 and osl[0] == 44
    assert t[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    raw = llama8b_raw(1.0, 512, 128, 2000, 60)
    raw["serving"]["traffic"] = {"trace": str(path), "trace_requests": 2000}
    raw["serving"]["simulation"] = {"requests": 500}
    r = cli(write(tmp_path, raw), "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert "AzureLLMInferenceTrace_conv.csv" in d["plan"]["traffic"]
    rate = d["plan"]["rates"][0]
    best = rate["modes"][rate["best_mode"]]
    assert best["simulated"]["attainment"] >= 0.9


def test_output_writes_launch_scripts_and_result(cli, tmp_path):
    out = tmp_path / "out"
    r = cli(INSTANCES / "serving_deepseek_v3_disagg.yaml", "--output", out)
    assert r.exit_code == 0, r.output
    scripts = sorted(f.name for f in out.glob("launch_*.sh"))
    assert any("prefill" in s and s.endswith("_sglang.sh") for s in scripts)
    assert any("decode" in s and s.endswith("_vllm.sh") for s in scripts)
    text = {f.name: f.read_text() for f in out.glob("launch_*.sh")}
    sg = next(t for n, t in text.items() if "prefill" in n and n.endswith("_sglang.sh"))
    assert "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 8 --dp-size 8 --enable-dp-attention" in sg
    assert "--ep-size 8" in sg and "--disaggregation-mode prefill" in sg
    vl = next(t for n, t in text.items() if "decode" in n and n.endswith("_vllm.sh"))
    assert "vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 8 --enable-expert-parallel" in vl
    assert "--max-num-seqs" in vl
    d = json.loads((out / "result.json").read_text())
    assert d["problem"] == "serving" and d["solver"]["status"] == d["status"]
    for k in ("problem", "name", "status", "objective", "plan", "binding", "alternatives", "conflicts",
              "definitions", "solver"):
        assert k in d
    assert d["objective"]["bound"] is not None and d["objective"]["gap"] is not None


def test_rate_sweep_table(cli, tmp_path):
    raw = llama70b_raw(simulation={"enabled": True, "requests": 300})
    raw["serving"]["traffic"]["rate_rps"] = [2, 8]
    r = cli(write(tmp_path, raw))
    assert r.exit_code == 0, r.output
    assert "Plans (analytic | simulated; * the best mode)" in r.stdout and "why not" in r.stdout and "vllm serve" in r.stdout


def test_unsorted_trace_starts_at_its_earliest_arrival(tmp_path):
    """A fresh user's unsorted trace (1 s, then 0.5 s) gave arrivals -0.5 and 0: the offset was
    the first line's time, not the earliest."""
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n1,100,10\n0.5,200,20\n3,300,30\n")
    t, isl, osl = read_trace(p, "serving.traffic.trace", tmp_path / "inst.yaml")
    assert list(t) == [0.0, 0.5, 2.5] and list(isl) == [200, 100, 300] and list(osl) == [20, 10, 30]


def test_launch_scripts_give_workers_on_one_server_their_own_gpus_and_port(cli, tmp_path):
    """Two TP1 workers fit one 8-GPU server: slot 1 must not reuse slot 0's GPUs or port (a fresh
    user's scripts all said --port 8000 and no GPU selection)."""
    import os
    import subprocess

    out = tmp_path / "out"
    r = cli(INSTANCES / "serving_qwen3_30b_a3b_mixed_pools.yaml", "--output", out)
    assert r.exit_code == 0, r.output
    script = next(out.glob("launch_*_vllm.sh"))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "vllm").write_text('#!/bin/sh\necho "GPUS=$CUDA_VISIBLE_DEVICES ARGS=$*"\n')
    (fake / "vllm").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    runs = [subprocess.run(["sh", str(script), str(slot)], capture_output=True, text=True, env=env) for slot in (0, 1, 7)]
    assert all(x.returncode == 0 for x in runs), [x.stderr for x in runs]
    gpus = [x.stdout.split()[0] for x in runs]
    assert gpus == ["GPUS=0", "GPUS=1", "GPUS=7"]
    assert [x.stdout.split()[-1] for x in runs] == ["8000", "8001", "8007"]
    bad = subprocess.run(["sh", str(script), "8"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "slot must be 0..7" in bad.stderr and bad.stdout == ""
    missing = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "usage:" in missing.stderr  # was slot 0 silently
    # another layout's workers on the same server: GPUS and PORT override the slot's
    own = subprocess.run(["sh", str(script), "0"], capture_output=True, text=True,
                         env={**env, "GPUS": "4,5", "PORT": "9100"})
    assert own.stdout.split()[0] == "GPUS=4,5" and own.stdout.split()[-1] == "9100"


def test_a_rate_sweep_the_time_limit_cuts_keeps_the_solved_rates(cli, tmp_path):
    """A fresh user's 60-rate sweep on --time-limit 1 ran 2 s, and a rate left without a plan
    crashed the text report: rates not begun by the limit are now reported as not solved (status
    time_limit, exit 4: the sweep is not answered), the solved ones keep their plans, and the
    first rate is always solved."""
    raw = llama70b_raw(mode="both")
    raw["serving"]["traffic"]["rate_rps"] = [float(r) for r in range(1, 61)]
    path = write(tmp_path, raw)
    d = serving_solve(raw, budget_limit=0.05)
    rates = d["plan"]["rates"]
    assert rates[0]["best_mode"] is not None  # the first rate, even with the limit already spent
    unsolved = [r for r in rates if r["best_mode"] is None]
    assert unsolved and all(m["status"] == "time_limit" for r in unsolved for m in r["modes"].values())
    # the sweep is not answered: time_limit (exit 4), the objective names the largest rate solved
    assert d["status"] == "time_limit" and d["objective"]["rate_rps"] == max(r["rate_rps"] for r in rates if r["best_mode"])
    assert any("not begun before the time limit" in c for c in d["solver"]["cut_short"])
    r = cli(path, "--time-limit", "0.05")
    assert r.exit_code == 4, r.output
    assert "not begun before the time limit" in " ".join(r.output.split()) and "Traceback" not in r.output
    assert "Workers of the best plan" in r.output


def serving_solve(raw, budget_limit: float) -> dict:
    import time

    import optimizer.serving as serving
    from optimizer.budget import Budget
    from tests.serving_helpers import problem

    budget = Budget.for_command(budget_limit, started=time.perf_counter())
    return serving.solve_instance(problem(raw), budget).to_dict()


def test_launch_commands_follow_the_weight_dtype(cli):
    """Llama-70B in FP8 planned on one H100 was printed as a plain BF16 `vllm serve` (141 GB on
    an 80 GB GPU): FP8 weights add `--quantization fp8` (vLLM quantizes a BF16 checkpoint online);
    INT4 weights say a 4-bit checkpoint is needed."""
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--set", "model.weight_dtype=fp8", "--set", "model.kv_dtype=fp8",
            "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    cmds = [c for rr in d["plan"]["rates"] for m in rr["modes"].values() for g in m.get("workers", [])
            for c in g["launch"].values()]
    assert cmds and all("--quantization fp8" in c for c in cmds)
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--format", "json")
    d = json.loads(r.stdout)
    assert not any("--quantization" in c for rr in d["plan"]["rates"] for m in rr["modes"].values()
                   for g in m.get("workers", []) for c in g["launch"].values())
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--set", "model.weight_dtype=int4", "--format", "json")
    assert any("4-bit checkpoint" in n for n in json.loads(r.stdout)["notes"])


@pytest.mark.parametrize("override,requirement", [("serving.slo.ttft_ms=1", "ttft_ms"), ("serving.slo.tpot_ms=0.5", "tpot_ms")])
def test_an_slo_no_worker_meets_gives_the_best_achievable(cli, override, requirement):
    """Conflicts were listed with no best-achievable value: now the lowest TTFT (TPOT) any worker
    reaches without load, against the target."""
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--set", override, "--format", "json")
    assert r.exit_code == 3, r.output
    a = json.loads(r.stdout)["achievable"]
    assert a["requirement"] == requirement and a["best"] > a["required"] > 0
    assert "even without load" in a["detail"]


def test_a_model_no_worker_holds_gives_the_memory_reason_as_best_achievable(cli, tmp_path):
    """A model far beyond the GPUs (10,000 layers of Llama-70B): the conflicts were listed with
    no best achievable; now the widest worker's memory reason."""
    cfg = json.loads((INSTANCES / "models" / "llama-3.1-70b.json").read_text())
    cfg["num_hidden_layers"] = 10_000
    (tmp_path / "big.json").write_text(json.dumps(cfg))
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--set", f"model.config={tmp_path / 'big.json'}", "--format", "json")
    assert r.exit_code == 3, r.output
    a = json.loads(r.stdout)["achievable"]
    assert a["requirement"] == "memory" and "no worker holds the weights" in a["detail"] and "TP8" in a["detail"]


def test_a_rate_listed_twice_is_bad_input(cli):
    """rate_rps [5, 5, 5] solved the same rate three times."""
    assert_one_line_error(cli(INSTANCES / "serving_llama70b_h100.yaml", "--set", "serving.traffic.rate_rps=[5,5,6]"),
                          "serving.traffic.rate_rps", "lists 5 more than once")


def test_negative_simulation_seed_is_bad_input(cli, tmp_path):
    """A fresh user's ``seed: -1`` was a numpy traceback (exit 1)."""
    raw = llama70b_raw(simulation={"requests": 100, "seed": -1})
    assert_one_line_error(cli(write(tmp_path, raw)), "serving.simulation.seed", "greater than or equal to 0")


@pytest.mark.parametrize("seed", ['"7"', "true", "1.5"])
def test_simulation_seed_must_be_a_whole_number(cli, tmp_path, seed):
    """``seed: "7"`` and ``seed: true`` were quietly taken as seeds."""
    path = write(tmp_path, llama70b_raw())
    assert_one_line_error(cli(path, "--set", f"serving.simulation.seed={seed}"), "serving.simulation.seed")
