"""A calibration file is for the models it was fitted on (issue #38, 7): an instance of another
model is refused (one line, exit 2), and ``optimize fidelity --calibration`` shows every row's
error before and after the file's factors."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import INSTANCES, assert_one_line_error

QWEN, LLAMA = "Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B"
# three dense aggregated rows of aiconfigurator-core's silicon_sample.csv on H100 under vLLM:
# two Llama-3.1-70B (InferenceMAX, 4 and 8 users) and one Qwen3-32B (gap analysis, 8 users)
ROWS = ("2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c4_tp4_ep1_653",
        "2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c8_tp8_ep1_742",
        "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp4_epnone_2")


def _cal(tmp_path: Path, models, source: str = "measured", factors=(1.0, 1.0, 0.0), name: str = "cal.yaml",
         group: tuple = ("h100_sxm", "vllm")) -> Path:
    """A calibration file as ``optimize calibrate`` writes it: the prior on top, ``factors`` for ``group``."""
    c = {"source": source, "prefill": 1.0, "decode": 1.0, "overhead_ms": 0.0}
    if models is not None:
        c["models"] = models
    if group:
        c["groups"] = [{"gpu_system": group[0], "engine": group[1], "prefill": factors[0], "decode": factors[1],
                        "overhead_ms": factors[2], "rows": 10}]
    p = tmp_path / name
    p.write_text(yaml.safe_dump({"calibration": c}, sort_keys=False))
    return p


def _instance(tmp_path: Path, base: str, cal: Path, name: str = "i.yaml", **perf) -> Path:
    raw = yaml.safe_load((INSTANCES / base).read_text())
    raw["model"]["config"] = str((INSTANCES / base).parent / raw["model"]["config"])
    raw["performance"] = {**perf, "calibration": str(cal)}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


# ------------------------------------------------------------------ an instance names the file
def test_calibration_of_other_models_is_refused(cli, cli_any, tmp_path):
    """Serving (model.hf_id), deployment (no hf_id: the config file's name) and estimate: one line
    naming the instance file, performance.calibration, the file's models and the instance's model."""
    cal = _cal(tmp_path, [QWEN, LLAMA], source="analytic")
    path = _instance(tmp_path, "serving_llama70b_h100.yaml", cal, source="analytic")
    assert_one_line_error(cli(path), "i.yaml", "performance.calibration",
                          f"cal.yaml was fitted on {QWEN}, {LLAMA}; this instance's model is "
                          "meta-llama/Llama-3.1-70B-Instruct (model.hf_id)")
    llama_only = _cal(tmp_path, [LLAMA], name="llama.yaml")
    path = _instance(tmp_path, "qwen32b_128k.yaml", llama_only, name="d.yaml", source="chapter")
    assert_one_line_error(cli(path), "d.yaml", "performance.calibration", f"llama.yaml was fitted on {LLAMA}",
                          "this instance's model is qwen3-32b (the config file's name; no model.hf_id)")
    path = _instance(tmp_path, "estimate/qwen32b_h200_tp8x4.yaml", llama_only, name="e.yaml", source="measured",
                     engine="vllm")
    assert_one_line_error(cli_any("estimate", path), "e.yaml", "performance.calibration",
                          f"this instance's model is {QWEN} (model.hf_id)")


def test_bad_models_field_is_one_line(cli_any, tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("calibration: {source: measured, prefill: 1, decode: 1, overhead_ms: 0, models: Qwen/Qwen3-32B}\n")
    path = _instance(tmp_path, "estimate/qwen32b_h200_tp8x4.yaml", cal, source="measured", engine="vllm")
    assert_one_line_error(cli_any("estimate", path), "cal.yaml", "calibration.models", "a list of model names")
    assert_one_line_error(cli_any("fidelity", tmp_path / "rows.csv", "--calibration", cal), "cal.yaml",
                          "calibration.models")
    assert_one_line_error(cli_any("fidelity", tmp_path / "rows.csv", "--calibration", tmp_path / "none.yaml"),
                          "--calibration", "no such calibration file")


def test_model_names_and_matching(tmp_path):
    """hf_id wins; else the config's _name_or_path and its file name; a name without an organisation
    matches the part after the other's '/' (calibrate names a result without --hf-id by its config)."""
    from optimizer.model.steptimes import Calibration, model_names, same_model

    cfg = tmp_path / "my-model.json"
    cfg.write_text(json.dumps({"_name_or_path": "Org/Base-7B", "hidden_size": 1}))
    assert model_names(cfg, "Org/Tuned-7B") == (("Org/Tuned-7B", "model.hf_id"),)
    assert [n for n, _ in model_names(cfg, None)] == ["Org/Base-7B", "my-model"]
    assert same_model("qwen3-32b", QWEN) and same_model("qwen/qwen3-32b", QWEN)
    assert not same_model("nvidia/Qwen3-32B", QWEN) and not same_model("Qwen/Qwen3-32B-FP8", QWEN)
    cal = Calibration(models=("Org/Base-7B",), file="c.yaml")
    assert cal.refusal(model_names(cfg, None)) is None  # found by _name_or_path
    assert "this instance's model is Org/Tuned-7B" in cal.refusal(model_names(cfg, "Org/Tuned-7B"))
    assert Calibration(file="old.yaml").refusal(model_names(cfg, "Org/Tuned-7B")) is None  # no models: any


def test_identity_factors_leave_every_step_exact():
    """Factors 1, 1, 0 return the base source's step bit for bit (no prefill/decode split to round)."""
    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.layout import Layout
    from optimizer.model.perf import PerfModel
    from optimizer.model.steptimes import AnalyticSteps, CalibratedSteps, Calibration

    pm = PerfModel(read_hf_config(INSTANCES / "models" / "qwen3-32b.json"), hardware_from_catalog("h100-sxm", "hgx-h100"))
    a, lay = AnalyticSteps(pm), Layout.tp(2)
    c = CalibratedSteps(a, Calibration(1.0, 1.0, 0.0, "analytic", "x.yaml"))
    for chunk, before, batch, ctx in ((1024, 512, 32, 2000), (777, 3, 5, 333), (0, 0, 17, 4096), (2048, 0, 0, 1)):
        assert c.mixed_step_s(lay, chunk, before, batch, ctx) == a.mixed_step_s(lay, chunk, before, batch, ctx)
    assert c.prefill_s(lay, 4096) == a.prefill_s(lay, 4096)


def test_calibration_of_the_model_is_applied(cli_any, tmp_path):
    """The right model (by hf_id, or by the config file's name without one) is calibrated: the
    plan's TPOT grows with the decode factor; a file without models: applies as before."""
    def tpot(cal: Path, drop_hf_id: bool = False) -> tuple[float, dict]:
        path = _instance(tmp_path, "estimate/qwen32b_h200_tp8x4.yaml", cal, source="measured", engine="vllm")
        raw = yaml.safe_load(path.read_text())
        raw["serving"]["traffic"]["concurrency"] = 8
        if drop_hf_id:
            raw["model"].pop("hf_id")
        path.write_text(yaml.safe_dump(raw))
        r = cli_any("estimate", path, "--format", "json", "--requests", "16")
        assert r.exit_code == 0, r.output
        e = json.loads(r.stdout)["plan"]["estimates"][0]
        return e["figures"]["tpot_ms"]["mean"], e["timing"]["h200-sxm"]

    base, t = tpot(_cal(tmp_path, None, group=(), name="none.yaml"))  # no models, no groups: the prior
    assert t["calibrated"]
    slow, t = tpot(_cal(tmp_path, [LLAMA, QWEN], factors=(1.0, 1.5, 0.0), group=("h200_sxm", "vllm")))
    assert t["calibrated"] and "decode x1.5" in t["why"] and slow > 1.3 * base
    by_name, _ = tpot(_cal(tmp_path, [QWEN], factors=(1.0, 1.5, 0.0), group=("h200_sxm", "vllm"), name="q.yaml"),
                      drop_hf_id=True)
    assert by_name == pytest.approx(slow, rel=1e-12)


# ------------------------------------------------------------------ fidelity before / after
@pytest.fixture(scope="module")
def rows_csv(tmp_path_factory) -> Path:
    from benchmarks.bench_fidelity import silicon_sample

    out = tmp_path_factory.mktemp("rows") / "rows.csv"
    with silicon_sample().open(newline="") as fh, out.open("w", newline="") as oh:
        r = csv.DictReader(fh)
        w = csv.DictWriter(oh, r.fieldnames)
        w.writeheader()
        w.writerows(row for row in r if row["id"] in ROWS)
    return out


def _fidelity(cli_any, rows_csv: Path, cal: Path, *args) -> dict:
    r = cli_any("fidelity", rows_csv, "--calibration", cal, "--format", "json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["plan"]


def test_fidelity_identity_calibration_changes_nothing(cli_any, tmp_path, rows_csv):
    """Factors 1, 1, 0 for every model: every row is calibrated and its after figures equal its
    before figures exactly, per row, per group and overall."""
    d = _fidelity(cli_any, rows_csv, _cal(tmp_path, [LLAMA, QWEN]), "--source", "measured")
    assert len(d["rows"]) == 3
    for row in d["rows"]:
        assert row["predicted"]["measured"] and row["calibrated"] == row["predicted"], row
        assert row["not_calibrated"] == {}
    for g in d["groups"]:
        before, after = g["errors"]["measured"], g["errors_after"]["measured"]
        assert after.pop("calibrated_rows") == before["n"] and after == before
    after = d["overall_after"]["measured"]
    assert after.pop("calibrated_rows") == 3 and after == d["overall"]["measured"]


def test_fidelity_before_after_by_source_and_model(cli_any, tmp_path, rows_csv):
    """Factors fitted on the measured source for Llama-3.1-70B: its rows change, the Qwen3-32B row and
    every analytic prediction keep their uncalibrated figures, each with the reason."""
    cal = _cal(tmp_path, [LLAMA], factors=(1.2, 1.3, 0.5))
    d = _fidelity(cli_any, rows_csv, cal, "--source", "measured,analytic")
    by_model = {g["model"]: g for g in d["groups"]}
    llama, qwen = by_model[LLAMA], by_model[QWEN]
    assert llama["errors_after"]["measured"]["calibrated_rows"] == 2
    assert llama["errors_after"]["measured"]["tpot_median"] != llama["errors"]["measured"]["tpot_median"]
    for row in d["rows"]:
        m = row["measured"]
        if row["group"][2] == LLAMA:  # decode x1.3 and 0.5 ms per step: every TPOT longer
            assert row["calibrated"]["measured"]["tpot_ms"] > 1.25 * row["predicted"]["measured"]["tpot_ms"], row
        else:
            assert "measured" not in row["calibrated"]
            assert row["not_calibrated"]["measured"] == (f"cal.yaml was fitted on {LLAMA}; this row's model is "
                                                         f"{QWEN}")
        assert "analytic" not in row["calibrated"]
        assert row["not_calibrated"]["analytic"] == "cal.yaml was fitted on the measured source"
        assert m["ttft_ms"] > 0
    q = qwen["errors_after"]["measured"]
    assert q.pop("calibrated_rows") == 0 and q == qwen["errors"]["measured"]
    a = d["overall_after"]["analytic"]
    assert a.pop("calibrated_rows") == 0 and a == d["overall"]["analytic"]
    assert d["calibration"]["not_applied"] == {"analytic": "cal.yaml was fitted on the measured source"}
    assert set(d["overall_after"]["measured"]) == {"n", "ttft_median", "tpot_median", "calibrated_rows"}
    # the table says the same
    r = cli_any("fidelity", rows_csv, "--calibration", cal, "--source", "measured")
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "before -> after cal.yaml" in out and "(2 calibrated by cal.yaml)" in out
    assert f"not calibrated (1 row, measured): cal.yaml was fitted on {LLAMA}; this row's model is {QWEN}" in out
