"""``optimize calibrate`` on measured serving runs: the benchmark clients' result files, the shrunk
per (GPU, engine) fit with its cross-validated strength, and refusal of fits worse than no fit."""
from __future__ import annotations

import csv
import json
import math
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
import yaml

from optimizer.serving import benchresults as br
from tests.conftest import INSTANCES, assert_one_line_error

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmark_results"
SILICON = Path(str(files("aiconfigurator_core") / "systems" / "silicon_sample.csv"))
QWEN = INSTANCES / "models" / "qwen3-32b.json"


def _vllm(**over) -> dict:
    """The fields ``vllm bench serve --save-result`` writes that the reader uses (vllm/benchmarks/serve.py)."""
    return {"date": "20250101-000000", "endpoint_type": "openai", "label": None, "model_id": "Qwen/Qwen3-32B",
            "tokenizer_id": "Qwen/Qwen3-32B", "num_prompts": 80, "request_rate": "inf", "burstiness": 1.0,
            "max_concurrency": 8, "duration": 30.0, "completed": 80, "total_input_tokens": 80 * 1024,
            "total_output_tokens": 80 * 128, "mean_ttft_ms": 120.0, "mean_tpot_ms": 14.0, **over}


def _write(tmp_path: Path, name: str, obj) -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


# ------------------------------------------------------------------ readers
def test_fixture_files_read_without_error():
    """Each kept result file is recognised by its content and read (values as the file holds them;
    the aiperf file is the tool's documented example, not a GPU measurement of ours)."""
    p = FIXTURES / "aiperf_profile_export_aiperf.json"
    assert br.detect(p) == "aiperf"
    (m,) = br.measurements(p, "aiperf")
    assert (m["ttft_ms"], m["tpot_ms"], m["concurrency"]) == (1588.797775365, 51.76, 100)
    assert m["isl"] == pytest.approx(110000 / 200) and m["osl"] == 96.85
    v = FIXTURES / "vllm_benchmark_serving_qwen3.5-397b-a17b-fp8_4xb300_tp4_conc16.json"
    assert br.detect(v) == "vllm"
    (m,) = br.measurements(v, "vllm")
    assert (m["ttft_ms"], m["tpot_ms"], m["concurrency"]) == (327.184301075431, 17.287081457823227, 16)
    assert (m["isl"], m["osl"]) == (122535 / 160, 119275 / 160)
    assert br.detect(SILICON) == "silicon_sample"
    from optimizer.serving.fidelity import read_rows

    assert len(read_rows(SILICON, limit=5)) == 5


def test_each_format_is_told_by_its_content(tmp_path):
    """vLLM JSON, SGLang JSONL (with its ``Infinity``), genai-perf (new and old concurrency field),
    each under a neutral name: the format comes from the fields, and the means from the right keys."""
    v = _write(tmp_path, "a.txt", _vllm())
    assert br.detect(v) == "vllm"
    (m,) = br.measurements(v, "vllm")
    assert (m["ttft_ms"], m["tpot_ms"], m["isl"], m["osl"], m["concurrency"]) == (120.0, 14.0, 1024, 128, 8)
    line = ('{"backend": "sglang", "dataset_name": "random", "request_rate": Infinity, "max_concurrency": 16, '
            '"completed": 10, "total_input_tokens": 20000, "total_output_tokens": 3000, "mean_ttft_ms": 300.5, '
            '"mean_tpot_ms": 21.0}')
    s = _write(tmp_path, "b.txt", line + "\n" + line.replace("16", "32") + "\n")
    assert br.detect(s) == "sglang"
    assert [m["concurrency"] for m in br.measurements(s, "sglang")] == [16, 32]
    rec = lambda avg, unit="ms": {"unit": unit, "avg": avg, "p50": avg}  # noqa: E731
    gp = {"time_to_first_token": rec(50.0), "inter_token_latency": rec(9.5), "request_latency": rec(900.0),
          "input_sequence_length": rec(2000.0, "tokens"), "output_sequence_length": rec(90.0, "tokens"),
          "request_throughput": {"unit": "requests/sec", "avg": 3.0},
          "input_config": {"perf_analyzer": {"stimulus": {"concurrency": 4}}}}
    g = _write(tmp_path, "c.txt", gp)
    assert br.detect(g) == "genai-perf"
    assert br.measurements(g, "genai-perf")[0] | {"where": 0} == {"ttft_ms": 50.0, "tpot_ms": 9.5, "osl": 90.0,
                                                                   "isl": 2000.0, "concurrency": 4, "where": 0}
    old = _write(tmp_path, "d.txt", gp | {"input_config": {"concurrency": 2, "model": ["m"]}})
    assert br.measurements(old, br.detect(old))[0]["concurrency"] == 2


def test_real_files_through_calibrate(cli_any):
    """The kept vLLM result (a B300 run) goes through ``optimize calibrate`` to a prediction; the kept
    SGLang file is open-loop (request rates, no --max-concurrency) and is refused on its first line."""
    v = FIXTURES / "vllm_benchmark_serving_qwen3.5-397b-a17b-fp8_4xb300_tp4_conc16.json"
    cfg = files("aiconfigurator_core") / "model_configs" / "Qwen--Qwen3.5-397B-A17B_config.json"
    r = cli_any("calibrate", v, "--gpu", "b300", "--engine", "sglang", "--tp", "4", "--config", str(cfg),
                "--dtype", "fp8", "--hf-id", "Qwen/Qwen3.5-397B-A17B-FP8", "--source", "analytic")
    assert r.exit_code == 0, r.output
    assert "b300_sxm sglang" in r.output and "(1 rows)" in r.output
    s = FIXTURES / "sglang_bench_serving_llama-3.3-70b_4xh200_tp4_online.jsonl"
    assert br.detect(s) == "sglang"
    assert_one_line_error(cli_any("calibrate", s, "--config", INSTANCES / "models" / "llama-3.1-70b.json",
                                  "--gpu", "h200-sxm", "--engine", "sglang", "--tp", "4"),
                          "sglang_bench_serving_llama-3.3-70b_4xh200_tp4_online.jsonl", "line 1.max_concurrency",
                          "request_rate 1.0", "closed-loop")


def test_bad_result_files_one_line_each(cli_any, tmp_path):
    run = ("--config", QWEN, "--gpu", "h100-sxm", "--engine", "vllm", "--tp", "4")
    unknown = _write(tmp_path, "u.json", {"accuracy": 0.5})
    assert_one_line_error(cli_any("calibrate", unknown, *run), "u.json", "not a result file of a known tool")
    text = _write(tmp_path, "notes.txt", "hello\n")
    assert_one_line_error(cli_any("calibrate", text, *run), "notes.txt", "known tool")
    fixture = FIXTURES / "aiperf_profile_export_aiperf.json"
    assert_one_line_error(cli_any("calibrate", fixture), "aiperf_profile_export_aiperf.json", "config",
                          "aiperf does not record it", "gpu, engine, tp")
    assert_one_line_error(cli_any("calibrate", fixture, "--config", QWEN, "--engine", "vllm", "--tp", "4"),
                          "aiperf_profile_export_aiperf.json", "gpu: required")
    no_tpot = _write(tmp_path, "v.json", {k: v for k, v in _vllm().items() if k != "mean_tpot_ms"})
    assert_one_line_error(cli_any("calibrate", no_tpot, *run), "v.json", "mean_tpot_ms", "missing")
    open_loop = _write(tmp_path, "o.json", _vllm(max_concurrency=None))
    assert_one_line_error(cli_any("calibrate", open_loop, *run), "o.json", "max_concurrency", "closed-loop")
    bad_gpu = ("--config", QWEN, "--gpu", "no-such-gpu", "--engine", "vllm", "--tp", "4")
    assert_one_line_error(cli_any("calibrate", _write(tmp_path, "w.json", _vllm()), *bad_gpu), "gpu", "no-such-gpu")
    runs = _write(tmp_path, "runs.yaml", yaml.safe_dump({"runs": [{"file": "w.json", "gpus": "h100-sxm"}]}))
    assert_one_line_error(cli_any("calibrate", "--runs", runs), "runs.yaml", "gpus")
    runs.write_text(yaml.safe_dump({"defaults": {"gpu": "h100-sxm", "engine": "vllm", "config": str(QWEN)},
                                    "runs": [{"file": "w.json"}]}))
    assert_one_line_error(cli_any("calibrate", "--runs", runs), "w.json", "tp", "runs file")


# ------------------------------------------------------------------ the fit
def _synthetic(truth, n=12, seed=0):
    """Cases whose linearisations are random and whose measurements are those of ``truth``
    (k_prefill, k_decode, overhead_ms) exactly."""
    from optimizer.serving.calibration import _Case, _linear
    from optimizer.serving.fidelity import Row

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ttft = np.array([rng.uniform(0.05, 0.5), rng.uniform(0.0, 0.05), rng.integers(1, 5), 0.0])
        tpot = np.array([rng.uniform(0.0, 0.004), rng.uniform(0.008, 0.03), 1.0, 0.0])
        c = _Case(Row(f"r{i}", ("h100_sxm", "vllm", f"m{i % 3}", "agg"), {"isl": 1, "osl": 2}, {}), None, ttft, tpot)
        t, p = _linear(c, truth)
        c.row.measured = {"ttft_ms": t * 1e3, "tpot_ms": p * 1e3}
        out.append(c)
    return out


def test_fit_recovers_factors_without_prior_and_shrinks_to_one_with_it():
    from optimizer.serving.calibration import fit

    truth = (0.7, 1.3, 2.0)
    cases = _synthetic(truth)
    f = fit(cases, 0.0)
    assert (f.prefill, f.decode, f.overhead_ms) == pytest.approx(truth, rel=1e-4, abs=1e-4)
    strong = fit(cases, 1e6)
    assert abs(math.log(strong.prefill)) < 1e-3 and abs(math.log(strong.decode)) < 1e-3 and strong.overhead_ms < 1e-3
    mid = fit(cases, 1.0)  # between: each log-factor shrunk part of the way towards 0
    assert 0 < math.log(1 / mid.prefill) < math.log(1 / truth[0]) and 0 < math.log(mid.decode) < math.log(truth[1])
    assert fit(cases, math.inf).prefill == 1.0 and fit([], 0.0).decode == 1.0


def test_cross_validation_picks_a_fit_when_the_bias_is_shared_and_no_fit_when_it_is_not():
    """A bias common to every model of a GPU and engine is learnt (a finite strength wins); biases
    that differ by model in opposite directions are not (the prior wins)."""
    from optimizer.serving.calibration import choose_lambda

    lam, scores = choose_lambda(_synthetic((0.6, 1.4, 1.0)), "model")
    assert math.isfinite(lam) and scores[lam] < scores[math.inf]
    mixed = _synthetic((0.5, 2.0, 0.0), n=6, seed=1)
    for c, flip in zip(_synthetic((2.0, 0.5, 0.0), n=6, seed=2), range(6)):
        c.row.group = ("h100_sxm", "vllm", "other", "agg")
        mixed.append(c)
    for c in mixed[:6]:
        c.row.group = ("h100_sxm", "vllm", "one", "agg")
    assert choose_lambda(mixed, "model")[0] == math.inf


# ------------------------------------------------------------------ silicon_sample.csv, leave one group out
def _slice(tmp_path: Path) -> Path:
    """Four (GPU, engine, model) units in two (GPU, engine) groups of silicon_sample.csv, 79 rows."""
    def keep(r):
        if r["system"] != "h100_sxm" or r["mode"] != "agg" or float(r["batch_size"] or 0) > 16:
            return False
        if r["backend"] == "trtllm":
            return (r["isl"], r["osl"]) == ("1024", "128") and r["model_path"] in ("Qwen/Qwen3-32B",
                                                                                  "meta-llama/Llama-3.1-8B-Instruct")
        return r["backend"] == "vllm" and r["model_path"] in ("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B")

    out = tmp_path / "rows.csv"
    with SILICON.open(newline="") as fh, out.open("w", newline="") as oh:
        r = csv.DictReader(fh)
        w = csv.DictWriter(oh, r.fieldnames)
        w.writeheader()
        w.writerows(row for row in r if keep(row))
    return out


def test_leave_one_group_out_never_worse_than_no_fit_as_written(cli_any, tmp_path):
    """Acceptance (issue #38, 7): in every held-out group the written calibration's median TTFT and
    TPOT errors are at most the uncalibrated ones (tolerance 1e-9); a (GPU, engine) is refused
    exactly when one of its models, fitted on the others, came out worse than no fit."""
    p = _slice(tmp_path)
    out = tmp_path / "cal.yaml"
    r = cli_any("calibrate", p, "--output", out, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["groups"]) == 4 and d["leave_one_group_out"]["rows"] == d["uncalibrated"]["rows"] > 40
    refused = {(fg["system"], fg["engine"]): fg["refused"] for fg in d["factor_groups"]}
    for g in d["groups"]:
        u, h = g["uncalibrated"], g["held_out"]
        worse = any(h[k] > u[k] + 1e-12 for k in ("ttft_median_abs_error", "tpot_median_abs_error"))
        if worse:  # the fit that hurt this model is not written
            assert refused[(g["system"], g["engine"])], g
    for fg in d["factor_groups"]:
        if not fg["refused"]:  # written factors: no unit of theirs held out worse
            for g in d["groups"]:
                if (g["system"], g["engine"]) == (fg["system"], fg["engine"]):
                    for k in ("ttft_median_abs_error", "tpot_median_abs_error"):
                        assert g["held_out"][k] <= g["uncalibrated"][k] + 1e-9, g
        else:
            assert fg["factors"] == {"prefill": 1.0, "decode": 1.0, "overhead_ms": 0.0}
    w, u = d["as_written"], d["uncalibrated"]
    assert w["ttft_median_abs_error"] <= u["ttft_median_abs_error"] + 1e-9
    assert w["tpot_median_abs_error"] <= u["tpot_median_abs_error"] + 1e-9
    doc = yaml.safe_load(out.read_text())["calibration"]
    assert doc["models"] == ["Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-8B-Instruct"]
    assert {(g["gpu_system"], g["engine"]) for g in doc["groups"]} == {("h100_sxm", "trtllm"), ("h100_sxm", "vllm")}
    from optimizer.model.steptimes import read_calibration

    c = read_calibration(out, None)  # the top-level keys stay what read_calibration reads: the prior
    assert (c.prefill, c.decode, c.overhead_s) == (1.0, 1.0, 0.0)


def test_benchmark_results_through_a_runs_file(cli_any, tmp_path):
    """Three vLLM result files (closed loops of Qwen3-32B TP4 on H100 at 4, 8 and 16 users) with a
    runs file: each is simulated, held out by run, and the file names the model it was fitted on.
    The numbers are invented; only the reading and the file are checked."""
    names = []
    for c, ttft, tpot in ((4, 90.0, 12.0), (8, 120.0, 14.0), (16, 180.0, 17.0)):
        names.append(_write(tmp_path, f"c{c}.json", _vllm(max_concurrency=c, num_prompts=4 * c, completed=4 * c,
                                                          total_input_tokens=4 * c * 1024,
                                                          total_output_tokens=4 * c * 128,
                                                          mean_ttft_ms=ttft, mean_tpot_ms=tpot)).name)
    runs = _write(tmp_path, "runs.yaml", yaml.safe_dump({
        "defaults": {"gpu": "h100-sxm", "engine": "vllm", "tp": 4, "config": str(QWEN), "hf_id": "Qwen/Qwen3-32B"},
        "runs": [{"file": n} for n in names]}))
    out = tmp_path / "cal.yaml"
    r = cli_any("calibrate", "--runs", runs, "--hold-out", "run", "--output", out, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["uncalibrated"]["rows"] == 3 and [g["rows"] for g in d["groups"]] == [1, 1, 1]
    assert yaml.safe_load(out.read_text())["calibration"]["models"] == ["Qwen/Qwen3-32B"]
