"""Issue #38 point 1: the default step-time source is ``auto`` (measured where the database covers
the GPU, engine and model; the roofline on fitted achieved peaks elsewhere), ``chapter`` is the
book's roofline at datasheet peaks, and every plan says which timed it."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.serving_helpers import INSTANCES, write

# The two new-user questions (ISL 2,000 / OSL 300, TTFT 1 s, TPOT 50 ms at p90, the default
# p90 and attainment): Llama-3.1-70B on HGX H100 at 20 req/s, Qwen3-30B-A3B on HGX H200 at 30 req/s.
QUESTIONS = {
    "llama70b": ("llama-3.1-70b.json", "meta-llama/Llama-3.1-70B", "h100-sxm", "hgx-h100", 20.0),
    "qwen3_30b_a3b": ("qwen3-30b-a3b.json", "Qwen/Qwen3-30B-A3B", "h200-sxm", "hgx-h200", 30.0),
}


def _question(name: str, servers: int, performance: dict | None) -> dict:
    cfg, hf, gpu, server, rate = QUESTIONS[name]
    raw = {"name": name, "model": {"config": str(INSTANCES / "models" / cfg), "hf_id": hf},
           "hardware": {"gpu": gpu, "server": server, "servers": servers},
           "serving": {"traffic": {"rate_rps": rate, "isl": 2000, "osl": 300}, "slo": {"ttft_ms": 1000, "tpot_ms": 50},
                       "simulation": {"enabled": False}}}
    if performance is not None:
        raw["performance"] = performance
    return raw


@pytest.mark.parametrize("name, servers", [("llama70b", 4), ("qwen3_30b_a3b", 2)])
def test_new_user_questions_default_plan_is_the_measured_plan(cli, tmp_path, name, servers):
    """The default plan needs the GPUs the plan under ``source: measured, engine: vllm`` needs
    (within one worker), and names its source and error band; the chapter's roofline needs fewer."""
    got = {}
    for key, perf in (("default", None), ("measured", {"source": "measured", "engine": "vllm"}),
                      ("chapter", {"source": "chapter"})):
        r = cli(write(tmp_path, _question(name, servers, perf), f"{key}.yaml"), "--format", "json")
        assert r.exit_code == 0, r.output
        got[key] = json.loads(r.stdout)
    gpus = {k: d["objective"]["value"] for k, d in got.items()}
    m = got["measured"]["plan"]
    best = m["rates"][0]["modes"][m["best_mode"]]
    worker = max(w["gpus_per_worker"] for w in best["workers"])
    assert abs(gpus["default"] - gpus["measured"]) <= worker, gpus
    assert gpus["chapter"] < gpus["measured"], gpus  # the peaks undersize
    timing = next(iter(got["default"]["plan"]["timing"].values()))
    assert timing["source"] == "measured" and timing["error_band"] is not None
    text = " ".join(cli(write(tmp_path, _question(name, servers, None), "text.yaml")).stdout.split())
    assert "timed by: measured kernels" in text and "measured error band TTFT ±" in text


def test_llama70b_on_two_servers_is_out_of_reach_by_default_as_measured(cli, tmp_path):
    """16 H100 carry less than 20 req/s of measured steps: the default says so, as ``measured`` does."""
    for perf in (None, {"source": "measured", "engine": "vllm"}):
        r = cli(write(tmp_path, _question("llama70b", 2, perf)), "--format", "json")
        assert r.exit_code == 3 and json.loads(r.stdout)["status"] == "infeasible", r.output


def test_chapter_source_is_the_roofline_at_the_peaks(tmp_path):
    """``chapter`` times a step exactly as the roofline at the catalog's peaks; ``analytic`` on the
    fitted shares (each step slower, by at most 1 / min share)."""
    from optimizer.model.efficiency import fitted_efficiency
    from optimizer.model.layout import Layout
    from optimizer.serving import load_problem

    raw = _question("llama70b", 1, {"source": "chapter"})
    p = load_problem(raw, INSTANCES / "test.yaml")
    pool = p.pools[0]
    from optimizer.model.prefill import mixed_step_s, prefill_s

    lay = Layout.tp(4)
    assert pool.steps.name == "chapter"
    assert pool.steps.prefill_s(lay, 2000) == prefill_s(pool.perf, lay, 2000)
    assert pool.steps.mixed_step_s(lay, 0, 0, 16, 2000) == mixed_step_s(pool.perf, lay, 0, 0, 16, 2000)
    raw["performance"] = {"source": "analytic"}
    a = load_problem(raw, INSTANCES / "test.yaml").pools[0].steps
    f = fitted_efficiency("h100-sxm", "vllm")
    for t_chapter, t_fit in ((prefill_s(pool.perf, lay, 2000), a.prefill_s(lay, 2000)),
                             (mixed_step_s(pool.perf, lay, 0, 0, 16, 2000), a.mixed_step_s(lay, 0, 0, 16, 2000))):
        assert t_chapter < t_fit <= t_chapter / min(f.compute, f.memory, f.network) * (1 + 1e-9)
    assert a.name == "analytic" and "achieved peaks" in a.why and "h100-sxm, vllm" in a.why


def test_efficiency_file_covers_every_gpu_the_database_has():
    """Every catalog GPU mapped to the database with kernels of an engine has a fit per engine (shares
    in (0, 1], better than the peaks on its own steps); every other catalog GPU has a generation."""
    from optimizer.catalog import load_catalog
    from optimizer.model.efficiency import _table, fitted_efficiency

    t = _table()
    for gpu, fits in t["fits"].items():
        for engine, e in fits.items():
            assert all(0 < e[k] <= 1 for k in ("compute", "memory", "network")), (gpu, engine)
            assert e["median_error_pct"] < e["median_error_at_peak_pct"], (gpu, engine)
    for gpu in load_catalog()["gpus"]:
        f = fitted_efficiency(gpu, "vllm")
        assert f is not None, gpu


@pytest.mark.slow
def test_efficiency_file_is_reproduced_by_its_generator():
    """The H100 / vLLM shares in the data file give the median step error the file states, over
    the generator's own steps (the file is what ``benchmarks.fit_efficiency`` wrote)."""
    import numpy as np

    from benchmarks import fit_efficiency as fe
    from optimizer.model.efficiency import _table

    e = _table()["fits"]["h100-sxm"]["vllm"]
    pts, _ = fe.points("h100-sxm", "hgx-h100", "vllm", quick=False)
    assert len(pts) == e["points"]
    x = np.log([e["compute"], e["memory"], e["network"]])
    assert fe.err(pts, x) == pytest.approx(e["median_error_pct"], abs=0.3)
    assert fe.err(pts, np.zeros(3)) == pytest.approx(e["median_error_at_peak_pct"], abs=0.05)


def test_book_instances_pin_the_chapter():
    """The shipped deployment and serving instances whose figures the docs quote pin ``chapter``."""
    for name in ("qwen32b_128k.yaml", "serving_llama70b_h100.yaml"):
        raw = yaml.safe_load((INSTANCES / name).read_text())
        assert raw["performance"] == {"source": "chapter"}, name


def _supernode_raw(performance: dict | None) -> dict:
    raw = yaml.safe_load((INSTANCES / "supernode_deepseek_v3.yaml").read_text())
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    raw.pop("performance", None)
    if performance is not None:
        raw["performance"] = performance
    return raw


def test_supernode_default_runs_the_roofline_on_the_cards_fitted_peaks(cli, tmp_path):
    """The supernode problem under the default: eq. 6-15 on the H100's fitted achieved peaks (it has
    no measured source yet, and says so); fewer tokens/s per card than at the datasheet peaks, by at
    most 1 / min(share); the chapter pin keeps the chapter's figures."""
    from optimizer.model.efficiency import fitted_efficiency

    got = {}
    for key, perf in (("default", None), ("chapter", {"source": "chapter"})):
        r = cli(write(tmp_path, _supernode_raw(perf), f"{key}.yaml"), "--format", "json")
        assert r.exit_code == 0, r.output
        got[key] = json.loads(r.stdout)
    t = got["default"]["plan"]["timing"]
    assert t["source"] == "analytic" and "no measured step times yet" in t["why"] and "h100-sxm" in t["why"]
    assert got["chapter"]["plan"]["timing"]["source"] == "chapter"
    f = fitted_efficiency("h100-sxm", "vllm")
    lo, hi = got["default"]["objective"]["value"], got["chapter"]["objective"]["value"]
    assert hi * min(f.compute, f.memory, f.network) <= lo < hi
    out = " ".join(cli(write(tmp_path, _supernode_raw(None), "text.yaml")).stdout.split())
    assert "step times: analytic roofline (eq. 6-15) (auto: the supernode problem has no measured step times yet)" in out


@pytest.mark.parametrize("perf, field, needle", [
    ({"source": "measured"}, "performance.source", "no measured step times yet"),
    ({"calibration": "cal.yaml"}, "performance.calibration", "does not have yet"),
    ({"source": "roofline"}, "performance.source", ""),
])
def test_supernode_bad_performance_block(cli, tmp_path, perf, field, needle):
    from tests.conftest import assert_one_line_error

    path = write(tmp_path, _supernode_raw(perf))
    assert_one_line_error(cli(path), str(path), field, *([needle] if needle else []))


@pytest.mark.parametrize("gpu, server", [("h100-sxm", "hgx-h100"), ("h800-sxm", "hgx-h800")])
def test_an_engine_version_nobody_has_is_one_line_under_the_default(cli, tmp_path, gpu, server):
    """Under auto an engine version the database lacks was a fallback to the roofline and then a
    traceback from the launch commands (a new user's run): now one line naming the field."""
    from tests.conftest import assert_one_line_error

    raw = _question("llama70b", 1, {"engine": "vllm", "engine_version": "0.99.0"})
    raw["hardware"].update(gpu=gpu, server=server)
    path = write(tmp_path, raw)
    assert_one_line_error(cli(path), str(path), "performance.engine_version", "0.99.0")
    book = yaml.safe_load((INSTANCES / "qwen32b_128k.yaml").read_text())
    book["model"]["config"] = str(INSTANCES / book["model"]["config"])
    book["performance"] = {"engine": "vllm", "engine_version": "0.99.0"}
    book["hardware"].update(gpu=gpu, server=server)
    path = write(tmp_path, book, "book.yaml")
    assert_one_line_error(cli(path), str(path), "performance.engine_version", "0.99.0")


def test_an_inline_gpu_in_a_serving_instance_says_serving_needs_a_catalog_name(cli, tmp_path):
    """A new user copied deployment's inline GPU into a serving instance and got "Input should be a
    valid string"; the line now says what serving needs."""
    from tests.conftest import assert_one_line_error

    raw = _question("llama70b", 1, None)
    raw["hardware"]["gpu"] = {"name": "mine", "memory_gb": 80}
    path = write(tmp_path, raw)
    assert_one_line_error(cli(path), str(path), "hardware.gpu", "catalog.yaml", "deployment instances")
