"""Serving results validate against the one result envelope (optimizer/schemas/result.schema.json)."""
from __future__ import annotations

import json

import pytest

from tests.serving_helpers import INSTANCES, REPO

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads((REPO / "optimizer" / "schemas" / "result.schema.json").read_text())


@pytest.mark.parametrize("args", [
    ("serving_llama70b_h100.yaml",),
    ("serving_qwen3_32b_slow_link.yaml",),
    ("serving_qwen3_32b_slow_link.yaml", "--set", "serving.mode=disaggregated"),
    ("serving_llama70b_h100.yaml", "--set", "serving.slo.tpot_ms=2", "--set", "serving.mode=aggregated"),
], ids=["plan", "both-with-infeasible-disagg", "infeasible-link", "infeasible-tpot"])
def test_serving_envelope_validates(cli, args):
    r = cli(INSTANCES / args[0], *args[1:], "--format", "json")
    assert r.exit_code in (0, 3), r.output
    d = json.loads(r.stdout)
    jsonschema.validate(d, SCHEMA)
    fams = [g["family"] for g in d["conflicts"]]
    assert len(fams) == len(set(fams))
    if d["status"] == "infeasible":
        assert d["plan"] is None and d["conflicts"] and all(g["detail"] for g in d["conflicts"])


def test_pareto_json_is_the_result_envelope(cli, tmp_path):
    """`--pareto` JSON had no plan or solver and a string objective (a fresh user's schema check
    failed); it is the one envelope now, the curves under plan."""
    r = cli(INSTANCES / "serving_llama70b_h100.yaml", "--pareto", "tpot", "--pareto-points", "4", "--output",
            tmp_path / "par", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    jsonschema.validate(d, SCHEMA)
    assert d["problem"] == "serving-pareto" and d["objective"]["name"] == "gpus"
    assert d["plan"]["curves"] and json.loads((tmp_path / "par" / "pareto.json").read_text())["plan"] == d["plan"]


def test_estimate_json_is_the_result_envelope():
    """`optimize estimate --format json` printed a bare ``{"estimates": [...]}`` (a fresh user's
    schema check failed); it is the one envelope now, status ``estimated``, the estimates under
    plan, every figure defined."""
    import subprocess
    import sys

    inst = INSTANCES / "estimate" / "qwen32b_h200_tp8x4.yaml"
    r = subprocess.run([sys.executable, "-m", "optimizer.cli", "estimate", str(inst), "--format", "json"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    jsonschema.validate(d, SCHEMA)
    assert d["problem"] == "serving-estimate" and d["status"] == "estimated" and d["objective"] is None
    est = d["plan"]["estimates"]
    assert est and all(e["figures"]["ttft_ms"]["mean"] > 0 for e in est)
    for k in est[0]["figures"]:
        if k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "attainment", "tokens_per_s_per_gpu", "tokens_per_s_per_user"):
            assert f"plan.estimates[].figures.{k}" in d["definitions"]
