"""The step-time sources (analytic / measured through aiconfigurator-core), ``optimize estimate``
(closed-loop traffic) and ``optimize fidelity`` (measured serving runs)."""
from __future__ import annotations

import csv
import json
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from optimizer.cli import cli as optimize
from tests.conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = ROOT / "instances"
SILICON = Path(str(files("aiconfigurator_core") / "systems" / "silicon_sample.csv"))


def run(*args):
    return CliRunner().invoke(optimize, [str(a) for a in args], catch_exceptions=False)


def write(tmp_path: Path, raw: dict, name: str = "i.yaml") -> Path:
    raw = dict(raw)
    raw["model"] = dict(raw["model"], config=str((INSTANCES / raw["model"]["config"]).resolve()))  # absolute stays
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def estimate_raw(source: str = "chapter", **perf) -> dict:
    raw = yaml.safe_load((INSTANCES / "estimate" / "qwen32b_h200_tp8x4.yaml").read_text())
    raw["model"]["config"] = str(INSTANCES / "models" / "qwen3-32b.json")
    raw["performance"] = {"source": source, **perf}
    if source in ("analytic", "chapter"):
        raw["performance"].pop("engine", None)
    return raw


# ------------------------------------------------------------------ sources
def test_analytic_source_is_the_roofline():
    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.layout import Layout
    from optimizer.model.perf import PerfModel
    from optimizer.model.prefill import Efficiency, mixed_step_s, prefill_s
    from optimizer.model.steptimes import AnalyticSteps

    pm = PerfModel(read_hf_config(INSTANCES / "models" / "qwen3-32b.json"), hardware_from_catalog("h100-sxm", "hgx-h100"))
    eff = Efficiency(0.7, 0.8, 0.9)
    a, lay = AnalyticSteps(pm, eff), Layout.tp(4)
    assert a.mixed_step_s(lay, 512, 1024, 17, 3000) == mixed_step_s(pm, lay, 512, 1024, 17, 3000, eff)
    assert a.prefill_s(lay, 4096) == prefill_s(pm, lay, 4096, eff)
    assert a.max_sessions(lay, 4000, 500) == pm.max_sessions(lay, 4000, 500)


def test_measured_table_reproduces_the_estimator():
    """Grid points equal aiconfigurator-core's own answer; between them the interpolation is within 3%."""
    from aiconfigurator_core.sdk import EngineHandle, compile_engine

    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.layout import Layout
    from optimizer.model.perf import PerfModel
    from optimizer.model.steptimes import Performance, resolve

    cfg = INSTANCES / "models" / "qwen3-32b.json"
    pm = PerfModel(read_hf_config(cfg), hardware_from_catalog("h100-sxm", "hgx-h100"))
    src = resolve(Performance("measured", "vllm"), pm, cfg, "h100-sxm")
    assert src.name == "measured" and "vllm 0.24.0 on h100_sxm" in src.why
    lay = Layout.tp(2)
    h = EngineHandle(compile_engine(str(src.model_dir), "h100_sxm", "vllm", src.version, tp_size=2,
                                    gemm_quant_mode="bfloat16", kvcache_quant_mode="bfloat16"))
    assert src.mixed_step_s(lay, 0, 0, 64, 4096) == pytest.approx(h.decode_step_latency(64, 4096, 2) * 1e-3, rel=1e-9)
    assert src.prefill_s(lay, 2048) == pytest.approx(h.mixed_step_latency(2048, 0, 2048, 2) * 1e-3, rel=1e-9)
    off = src.mixed_step_s(lay, 0, 0, 40, 3000)
    assert off == pytest.approx(h.decode_step_latency(40, 3000, 2) * 1e-3, rel=0.03)
    # KV capacity as the engine allows it: vLLM 0.24's 0.92 of 80 GB, minus weights and activations
    kind, frac = src.memory_fraction_of(lay)
    assert (kind, frac) == ("of_total", 0.92)
    assert 0 < src.kv_tokens(lay) < pm.max_sessions(lay, 1, 0)


def test_gemm_quant_names_the_kernel_lane_and_moe_experts_follow_the_weights():
    """performance.gemm_quant: fp8_block times the block-scaled FP8 GEMMs (aiconfigurator's lane for
    Qwen/Qwen3-32B-FP8); FP8 MoE experts are timed in the FP8 lane, not the BF16 the transcribed
    config.json would imply."""
    from aiconfigurator_core.sdk import EngineHandle, compile_engine

    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.layout import Layout
    from optimizer.model.perf import PerfModel
    from optimizer.model.steptimes import Performance, resolve

    cfg = INSTANCES / "models" / "qwen3-32b.json"
    pm = PerfModel(read_hf_config(cfg), hardware_from_catalog("h200-sxm", "hgx-h200"))
    block = resolve(Performance("measured", "trtllm", gemm_quant="fp8_block"), pm, cfg, "h200-sxm", weight_dtype="fp8",
                    kv_dtype="fp8")
    plain = resolve(Performance("measured", "trtllm"), pm, cfg, "h200-sxm", weight_dtype="fp8", kv_dtype="fp8")
    assert (block.gemm, plain.gemm, block.moe) == ("fp8_block", "fp8", None)
    assert "fp8_block GEMM kernels" in block.why and "GEMM kernels" not in plain.why
    lay = Layout.tp(8)
    assert block._key(lay) != plain._key(lay)
    h = EngineHandle(compile_engine(str(block.model_dir), "h200_sxm", "trtllm", block.version, tp_size=8,
                                    gemm_quant_mode="fp8_block", kvcache_quant_mode="fp8"))
    assert block.mixed_step_s(lay, 0, 0, 64, 4096) == pytest.approx(h.decode_step_latency(64, 4096, 2) * 1e-3, rel=1e-9)

    moe_cfg = INSTANCES / "models" / "qwen3-30b-a3b.json"
    mpm = PerfModel(read_hf_config(moe_cfg), hardware_from_catalog("h200-sxm", "hgx-h200"))
    moe = resolve(Performance("measured", "trtllm"), mpm, moe_cfg, "h200-sxm", weight_dtype="fp8", kv_dtype="fp8")
    assert moe.moe == "fp8" and moe._parallel(Layout.tp(2))["moe_quant_mode"] == "fp8"
    bf = resolve(Performance("measured", "trtllm"), mpm, moe_cfg, "h200-sxm")
    assert bf.moe == "bfloat16" and bf._key(Layout.tp(2)) != moe._key(Layout.tp(2))


def test_layout_the_database_cannot_time_is_left_out(tmp_path, monkeypatch):
    """Under measured, a layout the estimator cannot time (e.g. block-FP8 experts split 8 ways)
    is not a configuration (limit not_timed, its reason); when none can be timed the command
    fails naming the reason, as before."""
    from optimizer.model import measured

    real = measured.MeasuredSteps.table

    def table(self, lay):
        if lay.attention_tp == 8 or bad_all:
            raise measured.NotCovered("source", f"cannot time {lay.label()}: test says no")
        return real(self, lay)

    monkeypatch.setattr(measured.MeasuredSteps, "table", table)
    raw = estimate_raw("measured", engine="vllm")
    del raw["serving"]["fixed"]
    raw["serving"]["traffic"] = {"rate_rps": 2, "isl": 4000, "osl": 500}
    raw["serving"].update(mode="aggregated", aggregated={"tp": [4, 8]}, simulation={"requests": 200})
    raw["serving"]["slo"] = {"ttft_ms": 2000, "tpot_ms": 50}
    bad_all = False
    r = run(write(tmp_path, raw), "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    conf = {c["label"]: c for c in d["plan"]["configurations"]}
    assert conf["aggregated TP8 on h200-sxm"]["limited_by"] == "not_timed"
    assert "test says no" in conf["aggregated TP8 on h200-sxm"]["detail"]
    assert {w["layout"] for w in d["plan"]["rates"][0]["modes"]["aggregated"]["workers"]} == {"TP4"}
    bad_all = True
    assert_one_line_error(run(write(tmp_path, raw)), "performance.source", "test says no")


def test_gemm_quant_under_analytic_is_refused(tmp_path):
    raw = estimate_raw("analytic")
    raw["performance"]["gemm_quant"] = "fp8_block"
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "performance.gemm_quant", "measured source only")


# ------------------------------------------------------------------ bad input
def test_engine_version_the_database_lacks_names_the_versions(tmp_path):
    p = write(tmp_path, estimate_raw("measured", engine="vllm", engine_version="0.1.0"))
    r = run("estimate", p)
    assert_one_line_error(r, "performance.engine_version", "vllm 0.1.0", "0.24.0")


def test_gpu_without_database_measured_refuses_auto_falls_back(tmp_path):
    raw = estimate_raw("measured", engine="vllm")
    raw["hardware"] = {"gpu": "h800-sxm", "server": "hgx-h800", "servers": 4}
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "performance.source", "h800-sxm")
    raw["performance"]["source"] = "auto"
    raw["serving"]["traffic"]["concurrency"] = 4
    r = run("estimate", write(tmp_path, raw), "--format", "json", "--requests", "20")
    assert r.exit_code == 0, r.output
    assert "auto: timed by the analytic roofline" in r.stderr
    d = json.loads(r.stdout)["plan"]["estimates"][0]
    assert d["timing"]["h800-sxm"]["source"] == "analytic"
    # the H800 the database lacks runs the roofline on the Hopper GPUs' fitted shares of peak
    assert "carried from the hopper GPUs" in d["timing"]["h800-sxm"]["why"]


def test_engine_version_under_analytic_is_refused(tmp_path):
    raw = estimate_raw("analytic")
    raw["performance"]["engine_version"] = "0.24.0"
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "performance.engine_version", "measured source only")


def test_concurrency_and_rate_together_refused(tmp_path):
    raw = estimate_raw()
    raw["serving"]["traffic"]["rate_rps"] = 3
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.traffic.concurrency", "not both")


def test_optimiser_sizes_for_closed_loop_users(tmp_path):
    """N users: sized for the rate they generate at the SLO's latencies, checked by simulating the
    closed loop itself; feasible (no bound, no optimality claim), the attainment met in that simulation."""
    raw = estimate_raw()
    del raw["serving"]["fixed"]
    raw["serving"].update({"mode": "aggregated", "objective": "gpus", "slo": {"ttft_ms": 2000, "tpot_ms": 30},
                           "simulation": {"requests": 200}})
    raw["serving"]["traffic"] = {"concurrency": 16, "isl": 2000, "osl": 100}
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw)), "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "feasible" and d["objective"]["bound"] is None
    rate = d["plan"]["rates"][0]
    assert rate["rate_rps"] == pytest.approx(16 / (2.0 + 99 * 0.030))
    assert "closed loop of 16 users" in d["plan"]["traffic"]
    raw["serving"]["objective"] = "goodput"
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw))], catch_exceptions=False)
    assert_one_line_error(r, "serving.traffic.concurrency", "goodput")


def test_closed_loop_under_a_deadline_ends_with_its_last_request():
    """A fresh user's closed-loop ``--time-limit`` run simulated 4.2 million s (each sliced run
    leaves a stop event behind, so the loop never saw an empty queue) and then said ``optimal``.
    Sliced, the closed loop ends with its last request and equals the run without a deadline."""
    import time

    from optimizer.serving import load_problem
    from optimizer.serving.estimate import fixed_workers
    from optimizer.serving.simulate import simulate

    raw = estimate_raw()
    raw["serving"]["traffic"] = {"concurrency": 6, "isl": 1500, "osl": 40}
    p = load_problem(raw, ROOT / "instances" / "x.yaml")
    workers, counts, mode = fixed_workers(p)
    a = simulate(p, workers, counts, mode, 1.0, concurrency=6)
    t0 = time.perf_counter()
    b = simulate(p, workers, counts, mode, 1.0, concurrency=6, deadline=t0 + 20)
    assert a.to_dict() == b.to_dict() and a.completed == 60


def test_closed_loop_cut_by_the_time_limit_claims_no_optimum(tmp_path, monkeypatch):
    """Cut short, a closed-loop plan claims neither an optimum nor a check: the status is time_limit
    (exit 4; it was ``optimal``), the unchecked plan in the result without a bound."""
    from optimizer import serving
    from optimizer.serving.simulate import SimulationCut

    def cut(*_a, **_k):
        raise SimulationCut("simulated 0.0 s, 0 of 160 requests of the closed loop finished")

    monkeypatch.setattr(serving, "simulate", cut)
    raw = estimate_raw()
    del raw["serving"]["fixed"]
    raw["serving"].update({"mode": "aggregated", "objective": "gpus", "slo": {"ttft_ms": 2000, "tpot_ms": 30}})
    raw["serving"]["traffic"] = {"concurrency": 16, "isl": 2000, "osl": 100}
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw)), "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 4, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "time_limit" and d["objective"]["bound"] is None
    m = d["plan"]["rates"][0]["modes"]["aggregated"]
    assert m["simulation_cut_short"] and m["solver"]["status"] == "feasible" and m["bound"] is None


def test_estimate_needs_fixed(tmp_path):
    raw = estimate_raw()
    del raw["serving"]["fixed"]
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.fixed", "required")


# ------------------------------------------------------------------ estimate
def test_closed_loop_obeys_littles_law(tmp_path):
    """N users always in the system: N = throughput x end-to-end latency (within 2%)."""
    raw = estimate_raw()
    raw["serving"]["traffic"] = {"concurrency": 24, "classes": [{"isl": 1000, "osl": 200, "share": 0.5},
                                                                 {"isl": 3000, "osl": 60, "share": 0.5}]}
    raw["serving"]["fixed"]["workers"] = [{"role": "aggregated", "tp": 4, "count": 2}]
    r = run("estimate", write(tmp_path, raw), "--format", "json", "--requests", "600")
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)["plan"]["estimates"][0]["figures"]
    assert f["completed"] == 600
    assert f["request_rate_rps"] * f["e2e_ms"]["mean"] / 1e3 == pytest.approx(24, rel=0.02)


def test_staggered_closed_loop_obeys_littles_law_and_spreads_the_first_requests(tmp_path):
    """``start: staggered``: the users' first requests are spread over one zero-load request time;
    Little's law holds over the window once every user is in (within 2%), and the first requests'
    mean TTFT is that of the later ones (no first wave), where ``together`` queues them."""
    raw = estimate_raw()
    raw["serving"]["fixed"]["workers"] = [{"role": "aggregated", "tp": 4, "count": 1}]
    out = {}
    for start in ("together", "staggered"):
        raw["serving"]["traffic"] = {"concurrency": 32, "isl": 2000, "osl": 300, "start": start}
        r = run("estimate", write(tmp_path, raw, f"{start}.yaml"), "--format", "json", "--requests", "640")
        assert r.exit_code == 0, r.output
        out[start] = json.loads(r.stdout)["plan"]["estimates"][0]["figures"]
    f = out["staggered"]
    assert f["request_rate_rps"] * f["e2e_ms"]["mean"] / 1e3 == pytest.approx(32, rel=0.02)
    # the early requests count with the share of their life inside the window, as their tokens do
    # (completions alone were 3.5% above tokens/s / OSL)
    assert f["request_rate_rps"] == pytest.approx(f["tokens_per_s"] / 300, rel=0.01)
    assert f["ttft_ms"]["mean"] < out["together"]["ttft_ms"]["mean"]


def test_length_low_fraction_draws_uniform_integer_lengths():
    """``length_low_fraction: f``: every simulated request's ISL and OSL lie on the integers
    [floor(f L), L], spread over the range (a benchmark client's --random-range-ratio); the
    analytic model sees quantile points of the same distribution (mean within 1%)."""
    from optimizer.serving import load_problem
    from optimizer.serving.simulate import arrivals

    raw = estimate_raw()
    raw["serving"]["traffic"] = {"concurrency": 8, "classes": [{"isl": 1000, "osl": 200, "share": 0.25},
                                                                {"isl": 8192, "osl": 1024, "share": 0.75}],
                                 "length_low_fraction": 0.8}
    p = load_problem(raw, ROOT / "instances" / "x.yaml")
    reqs = arrivals(p, 1.0, 4000, 7)
    small = [r for r in reqs if r.isl <= 1000]
    big = [r for r in reqs if r.isl > 1000]
    assert all(800 <= r.isl <= 1000 and 160 <= r.osl <= 200 for r in small)
    assert all(6553 <= r.isl <= 8192 and 819 <= r.osl <= 1024 for r in big)
    assert len(small) / len(reqs) == pytest.approx(0.25, abs=0.03)
    assert {r.isl for r in small} >= {800, 1000} and len({r.osl for r in big}) > 150  # the whole range, not points
    want_isl = 0.25 * 900 + 0.75 * (6553 + 8192) / 2
    assert p.traffic.mean_isl == pytest.approx(want_isl, rel=0.01)
    assert float(np.mean([r.isl for r in reqs])) == pytest.approx(want_isl, rel=0.02)
    assert p.traffic.max_len <= 8192 + 1024


def test_length_low_fraction_closed_loop_obeys_littles_law(tmp_path):
    raw = estimate_raw()
    raw["serving"]["fixed"]["workers"] = [{"role": "aggregated", "tp": 4, "count": 1}]
    raw["serving"]["traffic"] = {"concurrency": 16, "isl": 2000, "osl": 200, "length_low_fraction": 0.5}
    r = run("estimate", write(tmp_path, raw), "--format", "json", "--requests", "800")
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)["plan"]["estimates"][0]["figures"]
    assert f["request_rate_rps"] * f["e2e_ms"]["mean"] / 1e3 == pytest.approx(16, rel=0.02)


def test_length_low_fraction_bad_input(tmp_path):
    raw = estimate_raw()
    for bad in (0, 1.5, "x"):
        raw["serving"]["traffic"] = {"concurrency": 4, "isl": 1000, "osl": 100, "length_low_fraction": bad}
        assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.traffic.length_low_fraction")
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n1,200,20\n")
    raw["serving"]["traffic"] = {"trace": str(trace), "length_low_fraction": 0.8}
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.traffic.length_low_fraction", "trace")
    del raw["serving"]["fixed"]
    raw["serving"]["objective"] = "gpus"
    raw["serving"]["traffic"] = {"windows": [{"length_min": 60, "rate_rps": 1.0, "isl": 1000, "osl": 100}],
                                 "length_low_fraction": 0.8}
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw))], catch_exceptions=False)
    assert_one_line_error(r, "serving.traffic.length_low_fraction", "day plan")


def test_fidelity_rows_take_their_benchmark_client(tmp_path):
    """An InferenceMAX row (dated source file) is simulated with its client's lengths, uniform on
    [0.8 L, L] (instances/fidelity/clients.yaml); a gap-analysis row with its lengths exactly."""
    from optimizer.serving import fidelity as fd

    p = _slice(tmp_path, 1, lambda r: r["silicon_data_source"].startswith("source_file=2026-")
               and "Llama-3.1-70B" in r["model_path"] and r["mode"] == "agg")
    row = fd.read_rows(p)[0]
    assert row.fields["client"].name == "InferenceMAX" and row.to_dict()["client"] == "InferenceMAX"
    raw = fd.instance_of(row, "measured", fd._mapping())[0]
    assert raw["serving"]["traffic"]["length_low_fraction"] == 0.8
    (tmp_path / "gap").mkdir()
    q = _slice(tmp_path / "gap", 1, lambda r: "gap-analysis" in r["silicon_data_source"] and r["mode"] == "agg"
               and r["model_path"] == "Qwen/Qwen3-32B" and r["system"] == "h100_sxm")
    row = fd.read_rows(q)[0]
    assert row.fields["client"] is None
    assert "length_low_fraction" not in fd.instance_of(row, "measured", fd._mapping())[0]["serving"]["traffic"]
    # another clients file: no client at all, or bad ones named by file and field
    none = tmp_path / "none.yaml"
    none.write_text("clients: []\n")
    assert fd.read_any(p, clients=none)[0].fields["client"] is None
    for text, field in (("clients: [{name: a, match: '('}]", "clients[0].match"),
                        ("clients: [{name: a, match: x, traffic: {isl: 3}}]", "clients[0].traffic"),
                        ("clients: [{name: a, match: x, traffic: {length_low_fraction: 2}}]",
                         "clients[0].traffic.length_low_fraction"),
                        ("clients: 3", "clients"), ("clients: [unclosed", "none.yaml")):
        none.write_text(text + "\n")
        assert_one_line_error(run("fidelity", p, "--clients", none), field)


def test_estimate_refuses_fewer_requests_than_users_and_a_mixed_homogeneous_plan(tmp_path):
    """A fresh user's ``--requests 10`` at 64 users silently ran 64; a homogeneous instance's mixed
    fixed plan was estimated as if mixing were allowed. Both are one line now."""
    raw = estimate_raw()
    assert_one_line_error(run("estimate", write(tmp_path, raw), "--requests", "10"), "--requests", "64 users")
    raw["serving"]["homogeneous"] = True
    raw["serving"]["fixed"]["workers"] = [{"role": "aggregated", "tp": 4, "count": 1},
                                          {"role": "aggregated", "tp": 8, "count": 1}]
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.homogeneous", "2 configurations")
    raw["serving"]["fixed"]["workers"] = [{"role": "aggregated", "tp": 4, "count": 2}]
    assert run("estimate", write(tmp_path, raw), "--requests", "64").exit_code == 0


def test_start_without_concurrency_is_bad_input(tmp_path):
    raw = estimate_raw()
    raw["serving"]["traffic"] = {"rate_rps": 2.0, "isl": 1000, "osl": 100, "start": "staggered"}
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.traffic.start", "closed-loop")
    raw["serving"]["traffic"] = {"concurrency": 4, "isl": 1000, "osl": 100, "start": "ramp"}
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.traffic.start")


def test_estimate_is_the_optimisers_simulation(tmp_path):
    """The optimiser's simulated figures of its plan = ``optimize estimate`` of the same workers (one path)."""
    from optimizer.serving import load_problem
    from optimizer.serving.estimate import estimate
    from optimizer.serving.perf import ServingModel
    from optimizer.serving.simulate import simulate

    raw = yaml.safe_load((INSTANCES / "serving_llama70b_h100.yaml").read_text())
    raw["serving"]["mode"] = "aggregated"
    p = load_problem(raw, INSTANCES / "serving_llama70b_h100.yaml")
    workers = ServingModel(p).workers(("aggregated",))
    j = next(i for i, w in enumerate(workers) if w.layout.attention_tp == 4)
    opt = simulate(p, workers, {j: 2}, "aggregated", 10.0)
    raw["serving"]["fixed"] = {"workers": [{"role": "aggregated", "tp": 4, "count": 2}]}
    e = estimate(load_problem(raw, INSTANCES / "serving_llama70b_h100.yaml"))[0].sim
    assert e.ttft_s == opt.ttft_s and e.tpot_s == opt.tpot_s and e.attainment == opt.attainment
    # workers of different sizes: the router weights each by its rate at the SLO in both (a fresh
    # user's 1 x TP4 + 3 x TP8 was 91.7% on time in the optimiser and 70.3% in estimate, whose
    # router split the requests equally)
    k = next(i for i, w in enumerate(workers) if w.layout.attention_tp == 8)
    assert workers[j].rate != workers[k].rate
    opt = simulate(p, workers, {j: 1, k: 1}, "aggregated", 10.0)
    raw["serving"]["fixed"] = {"workers": [{"role": "aggregated", "tp": 4, "count": 1},
                                           {"role": "aggregated", "tp": 8, "count": 1}]}
    e = estimate(load_problem(raw, INSTANCES / "serving_llama70b_h100.yaml"))[0].sim
    assert e.ttft_s == opt.ttft_s and e.tpot_s == opt.tpot_s and e.attainment == opt.attainment


def test_open_loop_estimate_past_capacity_says_so(tmp_path):
    raw = estimate_raw()
    raw["serving"]["traffic"] = {"rate_rps": [4, 400], "isl": 4000, "osl": 500}
    r = run("estimate", write(tmp_path, raw), "--format", "json")
    assert r.exit_code == 0, r.output
    low, high = json.loads(r.stdout)["plan"]["estimates"]
    # the open loop's request rate is the offered one (its Poisson arrivals); below capacity no note
    assert low["figures"]["request_rate_rps"] == pytest.approx(4, rel=0.05) and low["notes"] == []
    q = low["figures"]["quarters"]["ttft_s"]
    assert max(q) < 1.4 * min(q)  # a stable queue's quarters stay at one level
    # 100x the rate: the prompts queue longer and longer through the run, and the estimate says so
    q = high["figures"]["quarters"]["ttft_s"]
    assert q[0] < q[1] < q[2] < q[3] and high["notes"][0].startswith("past capacity: 400 req/s is more than")
    assert "mean TTFT" in high["notes"][0]
    r = run("estimate", write(tmp_path, raw), "--requests", "20")
    assert "too few to tell whether 4 req/s is within the workers' capacity" in r.output
    # a run shorter than two request lifetimes at the SLO cannot tell a plan filling up from one past capacity
    r = run("estimate", write(tmp_path, raw), "--requests", "60", "--format", "json")
    high = json.loads(r.stdout)["plan"]["estimates"][1]
    assert high["notes"][0].startswith("latency still rising at the end of the run") and "raise --requests" in high["notes"][0]


def test_estimate_json_is_strict_when_requests_never_finish(tmp_path):
    raw = estimate_raw()
    raw["serving"]["traffic"] = {"rate_rps": [1_000_000], "isl": 4000, "osl": 500}
    r = CliRunner().invoke(optimize, ["estimate", str(write(tmp_path, raw)), "--format", "json"])
    assert r.exit_code == 0, r.output

    def refuse(c):
        raise ValueError(f"non-standard JSON constant {c}")

    e = json.loads(r.stdout, parse_constant=refuse)["plan"]["estimates"][0]
    assert e["figures"]["ttft_ms"]["mean"] is None  # unfinished requests: no finite mean
    assert "past capacity" in e["notes"][0] and "unfinished" in e["notes"][-1]
    assert "RuntimeWarning" not in r.stderr


def test_estimate_warns_about_fields_it_does_not_use_and_numbers_given_for_text(tmp_path):
    est = INSTANCES / "estimate" / "qwen32b_h200_tp8x4.yaml"
    r = run("estimate", est, "--set", "serving.mode=aggregated", "--set", "serving.simulation.requests=100",
            "--requests", "64", "--format", "json")
    assert r.exit_code == 0, r.output
    assert "serving.mode: ignored by optimize estimate" in r.stderr
    assert "serving.simulation.requests: ignored in a closed loop" in r.stderr
    r = run("estimate", est, "--set", "performance.engine_version=9.9")
    assert_one_line_error(r, "performance.engine_version: Input should be a valid string (got 9.9); quote it")


def test_fixed_worker_needs_its_layout_and_its_pool(tmp_path):
    raw = estimate_raw()
    del raw["serving"]["fixed"]["workers"][0]["tp"]
    r = run("estimate", write(tmp_path, raw))
    assert_one_line_error(r, "serving.fixed.workers[0].tp: required field is missing")
    raw = yaml.safe_load((INSTANCES / "serving_qwen3_30b_a3b_mixed_pools.yaml").read_text())
    raw["serving"]["fixed"] = {"workers": [{"role": "aggregated", "tp": 1}]}
    r = run("estimate", write(tmp_path, raw))
    assert_one_line_error(r, "serving.fixed.workers[0].pool: required with more than one pool (the instance has "
                             "h100-sxm, h200-sxm)")


def test_vllm_admits_on_demand_and_preempts_where_trtllm_reserves_whole_lengths(tmp_path):
    """KV admission follows the engine: vLLM (and SGLang) admit a prompt when its blocks fit and
    preempt the newest request when the growing decodes overflow; TensorRT-LLM's default reserves
    each request's whole length. A KV-bound closed loop (Llama-3.1-70B FP8 on one H100, 48 users,
    1,024 + 4,096 tokens) runs more requests at once under vLLM, with preemptions and a shorter TTFT;
    where the cache does not bind, the two are the same simulation."""
    def est(engine, users, isl, osl):
        raw = {"name": "kv", "model": {"config": str(INSTANCES / "models" / "llama-3.1-70b.json"), "weight_dtype": "fp8"},
               "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": 1},
               "serving": {"traffic": {"concurrency": users, "isl": isl, "osl": osl},
                           "slo": {"ttft_ms": 1000, "tpot_ms": 100}, "fixed": {"workers": [{"role": "aggregated", "tp": 1}]}},
               "performance": {"source": "chapter", "engine": engine}}  # one step time for both engines
        r = run("estimate", write(tmp_path, raw), "--format", "json", "--requests", str(2 * users))
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["plan"]["estimates"][0]

    v, t = est("vllm", 48, 1024, 4096), est("trtllm", 48, 1024, 4096)
    assert v["workers"][0]["max_batch"] > 4 * t["workers"][0]["max_batch"]
    assert v["figures"]["preemptions"] > 0 and t["figures"]["preemptions"] == 0
    assert v["figures"]["completed"] == t["figures"]["completed"] == 96
    assert v["figures"]["ttft_ms"]["mean"] < 0.6 * t["figures"]["ttft_ms"]["mean"]
    assert "preemptions: the KV cache filled" in v["notes"][0]
    v, t = est("vllm", 8, 512, 64), est("trtllm", 8, 512, 64)
    assert v["figures"]["preemptions"] == 0 and v["figures"]["ttft_ms"] == t["figures"]["ttft_ms"]
    assert v["figures"]["tpot_ms"] == t["figures"]["tpot_ms"]


def test_estimate_time_limit_stops_a_long_simulation_without_figures(tmp_path):
    raw = estimate_raw()
    raw["serving"]["traffic"]["concurrency"] = 4000  # 40,000 requests: seconds of simulation
    p = write(tmp_path, raw)
    r = CliRunner().invoke(optimize, ["estimate", str(p), "--time-limit", "0.5", "--format", "json"])
    assert r.exit_code == 4, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "time_limit" and d["plan"]["estimates"] == []
    assert d["solver"]["cut_short"][0].startswith("time limit: the simulation of c=4000 was stopped after 0.5 s")
    assert "requests of the closed loop finished" in r.stderr
    r = run("estimate", p, "--time-limit", "nan")
    assert r.exit_code == 2 and "--time-limit: must be a positive, finite number" in r.output


def test_estimate_example_instance_runs():
    """The docs' example: aiconfigurator's README configuration (4 x TP8, 64 users) with measured kernels."""
    r = run("estimate", INSTANCES / "estimate" / "qwen32b_h200_tp8x4.yaml", "--format", "json", "--requests", "256")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["plan"]["estimates"][0]
    assert d["timing"]["h200-sxm"]["source"] == "measured" and d["gpus"] == 32
    f = d["figures"]
    assert f["request_rate_rps"] * f["e2e_ms"]["mean"] / 1e3 == pytest.approx(64, rel=0.02)


def test_estimate_max_batch_above_kv_refused(tmp_path):
    raw = estimate_raw()
    raw["serving"]["fixed"]["workers"][0]["max_batch"] = 90000
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.fixed.workers[0].max_batch", "KV cache")


def test_estimate_of_more_workers_than_the_gpus_is_refused(tmp_path):
    """A fresh user's 100 x TP8 on 32 GPUs was estimated (tokens/s per GPU over 800 GPUs)."""
    raw = estimate_raw()
    raw["serving"]["fixed"]["workers"][0]["count"] = 100
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "serving.fixed.workers", "more than the")


# ------------------------------------------------------------------ fidelity
def _slice(tmp_path: Path, n: int, keep) -> Path:
    out = tmp_path / "rows.csv"
    with SILICON.open(newline="") as fh, out.open("w", newline="") as oh:
        r = csv.DictReader(fh)
        w = csv.DictWriter(oh, r.fieldnames)
        w.writeheader()
        k = 0
        for row in r:
            if keep(row) and k < n:
                w.writerow(row)
                k += 1
    return out


def test_fidelity_kv_cache_dtype_follows_the_engine(tmp_path):
    """A TensorRT-LLM row with FP8 weights is timed with an FP8 KV cache (the engine configurations
    aiconfigurator generates); a vLLM row with FP8 weights keeps the default (BF16)."""
    from optimizer.serving import fidelity as fd

    def first(engine):
        p = _slice(tmp_path, 1, lambda r: r["backend"] == engine and r["mode"] == "agg" and
                   "fp8" in (r["gemm_quant_mode"] or r["precision"]).lower() and "Llama-3.1-70B" in r["model_path"])
        return fd.instance_of(fd.read_rows(p)[0], "measured", fd._mapping())[0]

    assert first("trtllm")["model"]["kv_dtype"] == "fp8"
    assert "kv_dtype" not in first("vllm")["model"]


def test_fidelity_rows_and_groups_json(tmp_path):
    p = _slice(tmp_path, 3, lambda r: r["system"] == "h100_sxm" and r["model_path"] == "Qwen/Qwen3-32B"
               and r["mode"] == "agg" and r["backend"] == "trtllm" and r["isl"] == "1024" and r["osl"] == "128"
               and float(r["batch_size"]) <= 16)
    r = run("fidelity", p, "--format", "json", "--plot", tmp_path)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    ids = [row["id"] for row in csv.DictReader(p.open())]
    assert [row["id"] for row in d["plan"]["rows"]] == ids
    for row in d["plan"]["rows"]:
        for src in ("analytic", "measured"):
            got = row["predicted"][src]
            assert got["ttft_ms"] > 0 and got["tpot_ms"] > 0
        # the measured kernels are closer on TPOT than the roofline at peak (the issue's 2.4x)
        m = row["measured"]["tpot_ms"]
        assert abs(row["predicted"]["measured"]["tpot_ms"] / m - 1) < abs(row["predicted"]["analytic"]["tpot_ms"] / m - 1)
    assert d["plan"]["groups"][0]["errors"]["measured"]["n"] == 3
    assert (tmp_path / "fidelity.png").stat().st_size > 0
    import jsonschema

    jsonschema.validate(d, json.loads((ROOT / "optimizer" / "schemas" / "result.schema.json").read_text()))
    assert d["problem"] == "serving-fidelity" and d["files"] == [str(tmp_path / "fidelity.png")]


def test_disaggregated_row_without_worker_counts_is_listed_not_guessed(tmp_path):
    p = _slice(tmp_path, 1, lambda r: r["mode"] == "disagg" and r["system"] == "h200_sxm"
               and r["prefill_num_workers"] == "")
    r = run("fidelity", p, "--format", "json", "--source", "analytic")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["plan"]["rows"][0]
    assert row["predicted"] == {} and row["skipped"]["analytic"] == ("a disaggregated row without "
                                                                     "prefill_num_workers and decode_num_workers")


def test_fidelity_unknown_precision_and_binary_files_are_named(tmp_path):
    p = _slice(tmp_path, 2, lambda r: r["system"] == "h100_sxm" and r["model_path"] == "Qwen/Qwen3-32B"
               and r["mode"] == "agg" and r["backend"] == "trtllm" and r["isl"] == "1024" and r["osl"] == "128")
    rows = list(csv.DictReader(p.open()))
    rows[0]["gemm_quant_mode"], rows[1]["gemm_quant_mode"], rows[1]["precision"] = "int3", "", "int2"
    with p.open("w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    r = run("fidelity", p, "--format", "json", "--source", "analytic")
    assert r.exit_code == 0, r.output
    got = [row["skipped"]["analytic"] for row in json.loads(r.stdout)["plan"]["rows"]]
    assert got[0].startswith("gemm_quant_mode 'int3': unknown weight precision (bf16, ")
    assert got[1].startswith("precision 'int2': unknown weight precision")
    b = tmp_path / "bin.csv"
    b.write_bytes(b"\x00\xff\xfe")
    r = run("fidelity", b)
    assert_one_line_error(r, "not UTF-8 text (byte 1)")
    short = tmp_path / "short.csv"
    short.write_text(p.read_text().splitlines()[0] + "\nrow-a,b,c\n")
    assert_one_line_error(run("fidelity", short), "row row-a: 3 fields, the header has 34")


def test_fidelity_lists_rows_it_cannot_run(tmp_path):
    p = _slice(tmp_path, 2, lambda r: r["mode"] == "disagg" and r["system"] == "h100_sxm")
    r = run("fidelity", p, "--format", "json", "--source", "analytic")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["plan"]["rows"]
    # DeepSeek-V3/R1 at TP16 crosses the 8-GPU server's NVLink domain: listed with the reason and the row's field
    assert len(rows) == 2 and all("TP16 crosses the scale-up domain (8 GPUs per server)" in row["skipped"]["analytic"]
                                  and row["skipped"]["analytic"].startswith(("prefill_tp_size: ", "decode_tp_size: "))
                                  for row in rows)


def test_checkpoint_fp8_fmha_without_a_context_table_is_timed_with_bf16_fmha(tmp_path):
    # DeepSeek-V3/R1 FP8 checkpoints infer FP8 FMHA; the TensorRT-LLM 1.3.0rc20 database on H200 has
    # its MLA context tables in BF16 only. aiconfigurator falls back to BF16 FMHA (same KV cache);
    # the measured source must too, rather than leave the row (agg or disagg) unpredicted.
    p = _slice(tmp_path, 1, lambda r: r["mode"] == "disagg" and r["system"] == "h200_sxm" and r["backend"] == "trtllm"
               and r["model_path"] == "deepseek-ai/DeepSeek-V3" and r["prefill_tp_size"] == "8"
               and r["decode_tp_size"] == "8" and r["decode_num_workers"] != "")
    r = CliRunner().invoke(optimize, ["fidelity", str(p), "--format", "json", "--source", "measured"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["plan"]["rows"][0]
    assert not row["skipped"] and row["predicted"]["measured"]["tpot_ms"] > 0, row


def test_fidelity_bad_row_names_row_and_field(tmp_path):
    p = _slice(tmp_path, 1, lambda r: r["mode"] == "agg")
    text = p.read_text().splitlines()
    rid = text[1].split(",")[0]
    text[1] = text[1].replace(",agg,", ",bogus,", 1)
    p.write_text("\n".join(text) + "\n")
    assert_one_line_error(run("fidelity", p), f"row {rid}.mode", "bogus")


# ------------------------------------------------------------------ engine schedulers and error bands
def _four_users(tmp_path, engine: str | None) -> dict:
    raw = estimate_raw()
    raw["serving"]["traffic"] = {"concurrency": 4, "isl": 512, "osl": 8}
    raw["serving"]["chunk_tokens"] = 512
    raw["serving"]["fixed"]["workers"] = [{"role": "aggregated", "tp": 8, "count": 1}]
    if engine:
        raw["performance"]["engine"] = engine
    r = run("estimate", write(tmp_path, raw), "--format", "json", "--requests", "4")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["plan"]["estimates"][0]["figures"]


def test_sglang_runs_each_prefill_batch_alone(tmp_path):
    """Four 512-token prompts at once, a 512-token step budget: SGLang's prefill-first scheduler runs
    four prefill-only steps before any decode, so the first tokens come at t, 2t, 3t, 4t (mean 2.5 t)
    with t the step of one 512-token prompt alone."""
    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.layout import Layout
    from optimizer.model.perf import PerfModel
    from optimizer.model.steptimes import AnalyticSteps

    pm = PerfModel(read_hf_config(INSTANCES / "models" / "qwen3-32b.json"), hardware_from_catalog("h200-sxm", "hgx-h200"),
                   1.0, 2.0, weight_dtype="fp8", kv_dtype="bf16")  # the KV default: bf16
    t = AnalyticSteps(pm).mixed_step_s(Layout.tp(8), 512, 0, 0, 0.0)
    f = _four_users(tmp_path, "sglang")
    assert f["ttft_ms"]["mean"] == pytest.approx(2.5 * t * 1e3, rel=1e-9)
    # vLLM mixes the later prompts with the first one's decodes: its first tokens differ
    assert _four_users(tmp_path, "vllm")["ttft_ms"]["mean"] != pytest.approx(f["ttft_ms"]["mean"], rel=1e-6)


def test_scheduler_follows_the_engine_only_when_named():
    from optimizer.serving.schema import Performance, PerformanceIn, scheduler_of

    # the default (auto) follows the default engine, vLLM; the roofline sources without an engine keep the
    # engine-neutral chunked policy (the chapter's figures)
    assert scheduler_of(PerformanceIn(), Performance()) == "mixed"
    assert scheduler_of(PerformanceIn(source="chapter"), Performance("chapter")) == "chunked"
    assert scheduler_of(PerformanceIn(source="analytic"), Performance("analytic")) == "chunked"
    assert scheduler_of(PerformanceIn(engine="sglang"), Performance(engine="sglang")) == "prefill_first"
    assert scheduler_of(PerformanceIn(source="measured"), Performance("measured", "vllm")) == "mixed"
    assert scheduler_of(PerformanceIn(engine="trtllm"), Performance(engine="trtllm")) == "mixed"


def test_plans_state_the_error_band_and_slo_margin_uses_it(tmp_path, monkeypatch):
    from optimizer.model import bands

    table = tmp_path / "fidelity.yaml"
    table.write_text(yaml.safe_dump({"source": "test table", "bands": {"h100_sxm": {"vllm": {
        "measured": {"rows": 7, "ttft_median_abs_error": 0.25, "tpot_median_abs_error": 0.1}}}}}))
    monkeypatch.setattr(bands, "BANDS_FILE", table)
    raw = yaml.safe_load((INSTANCES / "serving_llama70b_h100_measured.yaml").read_text())
    raw["serving"]["mode"] = "aggregated"
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw)), "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    timing = json.loads(r.stdout)["plan"]["timing"]["h100-sxm"]
    assert timing["source"] == "measured" and timing["error_band"]["tpot_median_abs_error"] == 0.1
    raw["serving"]["slo_margin"] = "band"
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw)), "--format", "json"], catch_exceptions=False)
    d = json.loads(r.stdout)
    assert d["plan"]["slo_margin"] == {"ttft_ms_asked": 1000.0, "tpot_ms_asked": 50.0, "ttft_error": 0.25,
                                       "tpot_error": 0.1}
    assert d["plan"]["slo"]["tpot_ms"] == pytest.approx(50 / 1.1)
    # a GPU/engine/source with no measured rows is uncalibrated: no band to plan with
    raw["performance"]["engine"] = "sglang"
    assert_one_line_error(CliRunner().invoke(optimize, [str(write(tmp_path, raw))], catch_exceptions=False),
                          "serving.slo_margin", "uncalibrated")


def test_table_interpolation_is_scipys_linear_rule():
    """The numpy trilinear lookup equals RegularGridInterpolator(linear, extrapolating) everywhere."""
    import numpy as np
    from scipy.interpolate import RegularGridInterpolator

    from optimizer.model.measured import CONTEXT_GRID, DECODE_GRID, PREFILL_GRID, _Table

    rng = np.random.default_rng(7)
    t = rng.random((len(PREFILL_GRID), len(DECODE_GRID), len(CONTEXT_GRID))) * 100
    ref = RegularGridInterpolator((PREFILL_GRID, DECODE_GRID, np.log(CONTEXT_GRID)), t, bounds_error=False,
                                  fill_value=None)
    p, d, s = rng.uniform(0, 2e5, 400), rng.uniform(0, 3000, 400), rng.uniform(50, 3e5, 400)
    want = np.maximum(ref(np.column_stack([p, d, np.log(s)])), 0)
    assert np.allclose(_Table(t, 1, ("of_total", 0.9)).ms(p, d, s), want, rtol=1e-12, atol=1e-9)


# ------------------------------------------------------------------ calibration on serving runs
def test_calibrated_step_scales_the_phases():
    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.layout import Layout
    from optimizer.model.perf import PerfModel
    from optimizer.model.steptimes import AnalyticSteps, CalibratedSteps, Calibration

    pm = PerfModel(read_hf_config(INSTANCES / "models" / "qwen3-32b.json"), hardware_from_catalog("h100-sxm", "hgx-h100"))
    a, lay = AnalyticSteps(pm), Layout.tp(2)
    c = CalibratedSteps(a, Calibration(1.5, 0.8, 0.002, "analytic", "x.yaml"))
    dec = a.mixed_step_s(lay, 0, 0, 32, 2000)
    full = a.mixed_step_s(lay, 1024, 512, 32, 2000)
    assert c.mixed_step_s(lay, 1024, 512, 32, 2000) == pytest.approx(0.8 * dec + 1.5 * (full - dec) + 0.002, rel=1e-12)
    assert c.mixed_step_s(lay, 0, 0, 32, 2000) == pytest.approx(0.8 * dec + 0.002, rel=1e-12)
    assert c.prefill_s(lay, 4096) == pytest.approx(1.5 * a.prefill_s(lay, 4096) + 0.002, rel=1e-12)
    assert c.max_sessions(lay, 4000, 500) == a.max_sessions(lay, 4000, 500)


def test_simulation_splits_each_request_into_phases():
    """At factors (1, 1, 0) the linearisation is the simulated mean itself."""
    from optimizer.serving import load_problem
    from optimizer.serving.estimate import estimate

    raw = estimate_raw()
    raw["serving"]["traffic"] = {"concurrency": 12, "classes": [{"isl": 900, "osl": 40, "share": 0.5},
                                                                 {"isl": 5000, "osl": 120, "share": 0.5}]}
    sim = estimate(load_problem(raw, INSTANCES / "estimate" / "qwen32b_h200_tp8x4.yaml"), 120)[0].sim
    for key, mean in (("ttft_s", sim.ttft_s["mean"]), ("tpot_s", sim.tpot_s["mean"])):
        pre, dec, steps, rest = sim.linear[key]
        assert pre + dec + rest == pytest.approx(mean, rel=1e-9) and steps > 0 and pre > 0


def test_calibrate_serving_runs_leave_one_group_out(tmp_path):
    keep = lambda r: (r["system"] == "h100_sxm" and r["mode"] == "agg" and r["backend"] == "trtllm"  # noqa: E731
                      and r["isl"] == "1024" and r["osl"] == "128" and float(r["batch_size"] or 0) <= 16
                      and r["model_path"] in ("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct"))
    p = _slice(tmp_path, 400, keep)
    ids = [row["id"] for row in csv.DictReader(p.open())]
    assert len({i.split("_")[0] for i in ids}) == 2  # two models: two groups
    out = tmp_path / "cal.yaml"
    r = run("calibrate", p, "--source", "measured", "--output", out, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["groups"]) == 2 and d["leave_one_group_out"]["rows"] == len(ids)
    for g in d["groups"]:  # each group held out was timed by factors fitted on the other group's rows only
        assert g["fitted_on_rows"] == len(ids) - g["rows"]
    # the file applies to a plan; the plan states it is calibrated and its held-out band
    raw = estimate_raw("measured", engine="trtllm")
    raw["performance"]["calibration"] = str(out)
    raw["serving"]["traffic"]["concurrency"] = 8
    r = run("estimate", write(tmp_path, raw), "--format", "json", "--requests", "16")
    assert r.exit_code == 0, r.output
    t = json.loads(r.stdout)["plan"]["estimates"][0]["timing"]["h200-sxm"]
    assert t["calibrated"] and "calibrated (cal.yaml" in t["why"]
    assert t["error_band"]["ttft_median_abs_error"] == pytest.approx(d["as_written"]["ttft_median_abs_error"], abs=1e-4)
    # fitted on one source, applied to another: refused
    raw["performance"] = {"source": "analytic", "calibration": str(out)}
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "performance.calibration", "measured source")


def test_bad_calibration_file_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("calibration: {source: measured, prefill: -1, decode: 1, overhead_ms: 0}\n")
    raw = estimate_raw("measured", engine="vllm")
    raw["performance"]["calibration"] = str(bad)
    assert_one_line_error(run("estimate", write(tmp_path, raw)), "calibration.prefill", "positive")


def test_fidelity_reads_vllm_and_sglang_bench_results(tmp_path):
    """``vllm bench serve --save-result`` JSON and SGLang bench_serving JSONL, with a mapping file."""
    mp = tmp_path / "map.yaml"
    mp.write_text(yaml.safe_dump({"model": str(INSTANCES / "models" / "qwen3-32b.json"), "gpu": "h100-sxm",
                                  "engine": "vllm", "tp": 4, "dtype": "bf16", "hf_id": "Qwen/Qwen3-32B"}))
    one = {"completed": 64, "total_input_tokens": 64 * 2000, "total_output_tokens": 64 * 200, "max_concurrency": 8,
           "mean_ttft_ms": 150.0, "mean_tpot_ms": 14.0}
    js = tmp_path / "vllm.json"
    js.write_text(json.dumps(one))
    r = run("fidelity", js, "--mapping", mp, "--source", "analytic", "--format", "json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["plan"]["rows"][0]
    assert row["measured"] == {"ttft_ms": 150.0, "tpot_ms": 14.0} and row["predicted"]["analytic"]["tpot_ms"] > 0
    jl = tmp_path / "sglang.jsonl"
    jl.write_text(json.dumps(one) + "\n" + json.dumps({**one, "max_concurrency": 16}) + "\n")
    r = run("fidelity", jl, "--mapping", mp, "--source", "analytic", "--format", "json")
    assert r.exit_code == 0 and len(json.loads(r.stdout)["plan"]["rows"]) == 2
    # an open-loop run (no max_concurrency) names the line and the key; no mapping: named
    jl.write_text(json.dumps({k: v for k, v in one.items() if k != "max_concurrency"}) + "\n")
    assert_one_line_error(run("fidelity", jl, "--mapping", mp), "line 1.max_concurrency")
    assert_one_line_error(run("fidelity", js), "--mapping")
    assert_one_line_error(run("fidelity", js, "--mapping", mp, "--clients", mp), "--clients", "silicon_sample.csv")


def test_measured_source_has_no_cp_timings(tmp_path):
    """A CP prefill layout under measured is no configuration (not_timed: the database has no CP
    timings); the cp = 1 layouts are timed by the database as before."""
    raw = estimate_raw("measured", engine="vllm")
    del raw["serving"]["fixed"]
    raw["serving"]["traffic"] = {"rate_rps": 1, "isl": 4000, "osl": 500}
    raw["serving"].update(mode="disaggregated", prefill={"tp": [4], "cp": [1, 2]}, decode={"tp": [4]},
                          simulation={"enabled": False})
    raw["serving"]["slo"] = {"ttft_ms": 2000, "tpot_ms": 50}
    r = run(write(tmp_path, raw), "--format", "json")
    assert r.exit_code == 0, r.output
    conf = {c["label"]: c for c in json.loads(r.stdout)["plan"]["configurations"]}
    assert conf["prefill TP4xCP2 on h200-sxm"]["limited_by"] == "not_timed"
    assert "no context- or sequence-parallel timings" in conf["prefill TP4xCP2 on h200-sxm"]["detail"]
    assert conf["prefill TP4 on h200-sxm"]["limited_by"] != "not_timed"


def test_a_bad_set_value_names_the_override():
    """A fresh user's ``--set`` error named only the instance file: it now names the override."""
    inst = INSTANCES / "serving_llama70b_h100.yaml"
    r = CliRunner().invoke(optimize, [str(inst), "--set", "serving.traffic.rate_rps=-3"], catch_exceptions=False)
    assert_one_line_error(r, "serving.traffic.rate_rps", "set by --set serving.traffic.rate_rps=-3")
    r = CliRunner().invoke(optimize, [str(inst), "--set", "hardware.servers=2", "--set", "serving.bogus=1"],
                           catch_exceptions=False)
    assert_one_line_error(r, "serving.bogus", "unknown key (set by --set serving.bogus=1)")
    est = INSTANCES / "estimate" / "qwen32b_h200_tp8x4.yaml"
    r = CliRunner().invoke(optimize, [str(est), "--set", "serving.fixed.workers.0.tp=abc"], catch_exceptions=False)
    assert_one_line_error(r, "serving.fixed.workers[0].tp", "(set by --set serving.fixed.workers.0.tp=abc)")
    r = CliRunner().invoke(optimize, [str(est), "--set", "serving.fixed.workers.-1.tp=2"], catch_exceptions=False)
    assert_one_line_error(r, "index -1 is out of range")
    # estimate takes --set too
    r = run("estimate", est, "--set", "serving.traffic.concurrency=abc")
    assert_one_line_error(r, "serving.traffic.concurrency", "(set by --set serving.traffic.concurrency=abc)")
    r = run("estimate", est, "--set", "serving.traffic.concurrency=16", "--requests", "32", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["plan"]["estimates"][0]["traffic"]["concurrency"] == 16
    # an error on a field holding several overrides names each of them, not the last one alone
    r = run("estimate", est, "--set", "serving.traffic.isl=100000", "--set", "serving.traffic.concurrency=4")
    assert_one_line_error(r, "serving.traffic: a request of 100500 tokens", "(set by --set serving.traffic.isl=100000, "
                             "--set serving.traffic.concurrency=4)")


def test_closed_loop_without_an_open_loop_plan_searches_smaller_sizings(tmp_path):
    """A fresh user's 36 users on one H200 server: the open-loop MILP has no plan at the rate the
    users generate at the SLO's latencies (6.8 req/s), and the closed loop was called infeasible
    (exit 3), though a disaggregated plan simulated 97% on time. Smaller sizings are now simulated
    as the closed loop; a plan found is feasible without a bound; none found is ``not_found``
    (exit 5), never ``infeasible``."""
    raw = estimate_raw("measured", engine="vllm")
    del raw["serving"]["fixed"]
    raw["hardware"]["servers"] = 1
    raw["serving"]["traffic"]["concurrency"] = 36
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw)), "--objective", "gpus", "--format", "json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "feasible" and d["objective"]["bound"] is None
    modes = d["plan"]["rates"][0]["modes"]
    found = [m for m in modes.values() if m["status"] == "ok"]
    assert found and all(m["capacity_margin"] < 1 and m["simulated"]["attainment"] >= 0.9 for m in found)
    assert all(m["status"] in ("ok", "not_found") and m.get("solver", {}).get("status") != "optimal"
               for m in modes.values())
    raw["serving"]["traffic"]["concurrency"] = 400
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw)), "--objective", "gpus"], catch_exceptions=False)
    assert r.exit_code == 5, r.output
    assert "No plan found for the closed loop" in r.output and "infeasible" not in r.output.split("\n")[0]


def test_pareto_refuses_closed_loop_traffic(tmp_path):
    """A fresh user's ``--pareto`` on closed-loop traffic crashed (IndexError): one line now."""
    raw = estimate_raw()
    del raw["serving"]["fixed"]
    r = CliRunner().invoke(optimize, [str(write(tmp_path, raw)), "--pareto", "tpot", "--output", str(tmp_path / "o")],
                           catch_exceptions=False)
    assert_one_line_error(r, "serving.traffic.concurrency", "--pareto")


def test_fidelity_bad_rows_and_options_are_named(tmp_path):
    """A fresh user's fidelity inputs: a fractional concurrency, an OSL of 1, an engine without a
    scheduler model, a header-only file, --mapping with a CSV, a source asked twice."""
    from optimizer.serving import fidelity as fd

    p = _slice(tmp_path, 1, lambda r: r["system"] == "h100_sxm" and r["model_path"] == "Qwen/Qwen3-32B"
               and r["mode"] == "agg" and r["backend"] == "trtllm")
    rows = list(csv.DictReader(p.open()))
    head = list(rows[0])

    def with_(**kw):
        out = tmp_path / "x.csv"
        with out.open("w", newline="") as fh:
            w = csv.DictWriter(fh, head)
            w.writeheader()
            w.writerow({**rows[0], **kw})
        return out

    assert_one_line_error(run("fidelity", with_(batch_size="4.5")), "batch_size", "whole number")
    row = fd.read_rows(with_(osl="1"))[0]
    assert "osl 1" in fd.instance_of(row, "analytic", fd._mapping())[1]
    row = fd.read_rows(with_(backend="tgi"))[0]
    assert "backend tgi" in fd.instance_of(row, "analytic", fd._mapping())[1]
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(head) + "\n")
    assert_one_line_error(run("fidelity", empty), "no measured rows")
    assert_one_line_error(run("fidelity", p, "--mapping", p), "--mapping", ".json")
    r = run("fidelity", p, "--source", "analytic,analytic", "--format", "json")
    assert r.exit_code == 0 and list(json.loads(r.stdout)["plan"]["rows"][0]["predicted"]) == ["analytic"]


def test_closed_loop_disaggregated_grows_prefill_for_the_first_wave(tmp_path):
    """A fresh user's 32 users on the README's Llama-3.1-70B instance, disaggregated: `not_found`
    after 2x the users' rate (one prefill worker under a first wave of 32 prompts, 1.9% on time),
    while 2 x P TP2 + 1 x D TP4 estimates at 94%. A closed loop's capacity now grows to 8x."""
    inst = INSTANCES / "serving_llama70b_h100.yaml"
    r = CliRunner().invoke(optimize, [str(inst), "--set", "serving.traffic={concurrency: 32, isl: 2048, osl: 256}",
                                      "--set", "serving.mode=disaggregated", "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["plan"]["rates"][0]["modes"]["disaggregated"]
    assert m["status"] == "ok" and m["simulated"]["attainment"] >= 0.9 and m["gpus"] <= 10


def test_closed_loop_prefers_a_checked_plan_and_needs_the_simulation(tmp_path, monkeypatch):
    """Under a time limit a closed loop's unchecked plan (simulation cut) lost to nothing: a fresh
    user got a 32-GPU plan at 0.7% on time over a checked 40-GPU one. A checked plan now comes
    first; with only unchecked plans the status is time_limit (exit 4); with the simulation
    disabled a closed loop is refused."""
    from optimizer import serving
    from optimizer.serving.simulate import SimulationCut

    real = serving.simulate

    def cut_aggregated(p, workers, counts, mode, *a, **k):
        if mode == "aggregated":
            raise SimulationCut("simulated 0.0 s, 0 of 320 requests of the closed loop finished")
        return real(p, workers, counts, mode, *a, **k)

    monkeypatch.setattr(serving, "simulate", cut_aggregated)
    inst = INSTANCES / "serving_llama70b_h100.yaml"
    args = [str(inst), "--set", "serving.traffic={concurrency: 32, isl: 2048, osl: 256}", "--format", "json"]
    r = CliRunner().invoke(optimize, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    rate = d["plan"]["rates"][0]
    # the unchecked aggregated plan has fewer GPUs (4 against 8): the checked one wins
    assert rate["modes"]["aggregated"]["gpus"] < rate["modes"]["disaggregated"]["gpus"]
    assert rate["best_mode"] == "disaggregated" and rate["modes"]["aggregated"]["simulation_cut_short"]
    r = CliRunner().invoke(optimize, args + ["--set", "serving.mode=aggregated"], catch_exceptions=False)
    assert r.exit_code == 4 and json.loads(r.stdout)["status"] == "time_limit"
    r = CliRunner().invoke(optimize, args[:-2] + ["--set", "serving.simulation.enabled=false"], catch_exceptions=False)
    assert_one_line_error(r, "serving.simulation.enabled", "closed-loop")


def test_fidelity_bench_results_bad_input_is_one_line(tmp_path):
    """A fresh user's broken benchmark results and mappings ended in tracebacks (JSONDecodeError,
    AttributeError, TypeError, ...) or were read (``completed: true``, ``1e400``)."""
    ok = {"completed": 64, "total_input_tokens": 128000, "total_output_tokens": 12800, "max_concurrency": 8,
          "mean_ttft_ms": 100, "mean_tpot_ms": 10}
    mp = tmp_path / "mp.yaml"
    mp.write_text(f"model: {INSTANCES / 'models' / 'qwen3-32b.json'}\ngpu: h100-sxm\nengine: vllm\ntp: 2\n")
    cases = [('{"a":', "not JSON"), ("[1, 2]", "JSON object"), (json.dumps({**ok, "completed": True}), "completed"),
             (json.dumps(ok).replace("100", "1e400"), "mean_ttft_ms")]
    for text, words in cases:
        f = tmp_path / "r.json"
        f.write_text(text)
        assert_one_line_error(run("fidelity", f, "--mapping", mp), words)
    f = tmp_path / "r.json"
    f.write_text(json.dumps(ok))
    for bad, field in (("tp: abc", "tp"), ("dtype: int3", "dtype"), ("gpu: [1]", "gpu")):
        m = tmp_path / "m.yaml"
        m.write_text(mp.read_text().replace("tp: 2", "tp: 2" if bad.startswith(("dtype", "gpu")) else bad)
                     .replace("gpu: h100-sxm", bad if bad.startswith("gpu") else "gpu: h100-sxm")
                     + (bad + "\n" if bad.startswith("dtype") else ""))
        assert_one_line_error(run("fidelity", f, "--mapping", m), field)
    m.write_text("model gpu engine tp\n")
    assert_one_line_error(run("fidelity", f, "--mapping", m), "mapping")


@pytest.mark.slow  # ~30 s
def test_issue_fidelity_targets_on_a_systematic_quarter_of_the_dense_rows():
    """Issue #24's acceptance: on the dense aggregated H100/H200 rows the measured source predicts
    TTFT within a median 25% and TPOT within 10% (benchmarks/bench_fidelity.py runs all 778 rows:
    23.5% / 9%). Here every fourth row (195 rows; 21% / 9.7% when written), each with its benchmark
    client, nothing fitted; and the published figures in benchmarks/results/fidelity.json meet the
    targets too."""
    from benchmarks.bench_fidelity import select
    from optimizer.serving import fidelity as fd

    path = select(False)
    rows = fd.read_rows(path)[::4]
    fd.predict(rows, ("measured",), path)
    o = fd.overall(rows, ("measured",))["measured"]
    assert o["n"] >= 190
    assert o["ttft_median"] <= 0.25 and o["tpot_median"] <= 0.10
    published = json.loads((ROOT / "benchmarks" / "results" / "fidelity.json").read_text())["overall"]["measured"]
    assert published["n"] >= 770 and published["ttft_median"] <= 0.25 and published["tpot_median"] <= 0.10
