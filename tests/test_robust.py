"""``--robust`` (issue #38 point 5): the plan that still meets the targets at the pessimistic end of
the step-time source's measured error band, reported beside the nominal plan with what it costs."""
from __future__ import annotations

import json

import yaml

from tests.conftest import assert_one_line_error
from tests.deploy_helpers import with_inline_h100_like_gpu
from tests.serving_helpers import INSTANCES, write


def _qwen3_30b(servers: int = 2) -> dict:
    return {"name": "qwen3-30b-a3b at 30 req/s", "model": {"config": str(INSTANCES / "models" / "qwen3-30b-a3b.json"),
                                                           "hf_id": "Qwen/Qwen3-30B-A3B"},
            "hardware": {"gpu": "h200-sxm", "server": "hgx-h200", "servers": servers},
            "serving": {"traffic": {"rate_rps": 30, "isl": 2000, "osl": 300}, "slo": {"ttft_ms": 1000, "tpot_ms": 50},
                        "simulation": {"enabled": False}}}


def test_serving_robust_plan_meets_the_tightened_targets_and_says_what_it_costs(cli, tmp_path):
    """Qwen3-30B-A3B on H200 at 30 req/s: the nominal plan's TPOT sits at the target; planned to
    TPOT / (1 + the measured band), the robust plan needs a GPU more, and it is the plan
    ``serving.slo_margin: band`` gives."""
    path = write(tmp_path, _qwen3_30b())
    r = cli(path, "--robust", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    rb = d["robust"]
    assert rb["status"] == "optimal" and rb["value"] > rb["nominal_value"] == d["objective"]["value"]
    assert rb["extra"] == rb["value"] - rb["nominal_value"]
    assert rb["band"] == {"ttft_error": rb["plan"]["slo_margin"]["ttft_error"],
                          "tpot_error": rb["plan"]["slo_margin"]["tpot_error"]}
    m = rb["plan"]["slo_margin"]
    assert 0 < m["tpot_error"] < 1 and "TPOT 50 ms / (1 + " in rb["tightened"]
    raw = _qwen3_30b()
    raw["serving"]["slo_margin"] = "band"
    band = json.loads(cli(write(tmp_path, raw, "band.yaml"), "--format", "json").stdout)
    assert band["objective"]["value"] == rb["value"]
    text = " ".join(cli(path, "--robust").stdout.split())
    assert f"robust to the error band (TTFT 1000 ms / (1 + " in text and "against 2 nominal (+1 GPUs)" in text


def test_deployment_robust_plan_tightens_every_deadline_by_the_finish_time_band(cli, tmp_path):
    """The book instance under the measured source at 2 of 4 on time: the robust twin's deadlines are
    the nominal ones / (1 + band); its cost per on-time session is at least the nominal one (a
    smaller feasible set) and its on-time sessions finish by the tightened deadlines."""
    raw = yaml.safe_load((INSTANCES / "qwen32b_128k.yaml").read_text())
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    raw["performance"] = {"source": "measured", "engine": "vllm"}
    raw["workload"]["min_on_time_fraction"] = 0.5
    path = tmp_path / "book.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = cli(path, "--objective", "cost", "--robust", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    rb = d["robust"]
    e = d["timing"]["error_band"]["finish_time_error"]
    assert rb["band"] == e and f"(1 + {e:.1%})" in rb["tightened"]
    assert rb["value"] >= rb["nominal_value"] - 1e-9
    deadline = min(g["deadline_ms"] for g in raw["workload"]["sessions"] if g.get("deadline_ms"))
    on_time = [s for s in rb["plan"]["sessions"] if s.get("on_time")]
    assert on_time and all(s["finish_ms"] <= deadline / (1 + e) + 1e-6 for s in on_time)


def test_robust_bad_input(cli, tmp_path):
    assert_one_line_error(cli(INSTANCES / "hgx_h100_120kw.yaml", "--robust"), "hgx_h100_120kw.yaml", "--robust",
                          "deployment and serving")
    raw = _qwen3_30b()
    raw["serving"]["slo_margin"] = "band"
    assert_one_line_error(cli(write(tmp_path, raw), "--robust"), "inst.yaml", "--robust", "band already")
    raw = _qwen3_30b()
    raw["hardware"].update(gpu="h800-sxm", server="hgx-h800")  # no measured runs: no band
    assert_one_line_error(cli(write(tmp_path, raw, "h800.yaml"), "--robust"), "h800.yaml: --robust", "no measured error band")
    book = yaml.safe_load((INSTANCES / "qwen32b_128k.yaml").read_text())
    book["model"]["config"] = str(INSTANCES / book["model"]["config"])
    with_inline_h100_like_gpu(book)
    path = tmp_path / "inline.yaml"
    path.write_text(yaml.safe_dump(book))
    assert_one_line_error(cli(path, "--robust"), str(path), "performance", "uncalibrated")
