"""Every problem returns the one result envelope described by
``optimizer/schemas/result.schema.json``: the output of every instance in ``instances/``
validates against it, and ``--output DIR`` says what it wrote."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import INSTANCES, REPO

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads((REPO / "optimizer" / "schemas" / "result.schema.json").read_text())


INFEASIBLE: set[str] = set()  # instances whose answer is "infeasible" (exit 3): none today


def problem_instances() -> list[Path]:
    """Every YAML in instances/ that is a problem instance (hardware catalogs excluded; sweep grids,
    ``base:`` + ``grid:``, run with ``optimize sweep`` and are tested in tests/test_sweep.py)."""
    import yaml

    out = []
    for p in sorted(INSTANCES.glob("*.yaml")):
        raw = yaml.safe_load(p.read_text())
        if isinstance(raw, dict) and "grid" in raw and "base" in raw:
            continue
        out.append(p)
    return out


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", problem_instances(), ids=lambda p: p.name)
def test_every_instance_output_validates_and_plots(path, cli, tmp_path):
    """One run per instance checks both the envelope (with what ``--output`` wrote) and the PNGs
    ``--plot`` wrote (tests/test_plots.py: which ones each problem must write)."""
    from tests.test_plots import assert_instance_pngs

    text = path.read_text()
    if "shared/data" in text and not (REPO.parent / "shared" / "data").exists():
        pytest.skip("needs ../shared/data")
    # no wall-clock limit: each instance is solved to its end (the expert search with little
    # deterministic work, it took 19.5 s of a 20 s limit at its default)
    quick = ["--set", "experts.work_units_per_layer=0.05"] if "experts" in (yaml.safe_load(text) or {}) else []
    r = cli(path, "--format", "json", "--output", tmp_path / "out", "--plot", tmp_path / "plots", *quick)
    assert r.exit_code in (0, 3), r.output
    d = json.loads(r.stdout)  # stdout stays one JSON object
    jsonschema.validate(d, SCHEMA)
    assert d["definitions"], "every figure carries its definition"
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["problem"] == d["problem"] and saved["status"] == d["status"]
    # --format json lists what --output wrote in the envelope's "files" (the text format says
    # "wrote ..." on stderr instead)
    assert len(d["files"]) == len(set(d["files"])), d["files"]  # each file once (--output and --plot)
    result_json = str(tmp_path / "out" / "result.json")
    assert result_json in d["files"], d.get("files")
    assert r.exit_code == 0 or path.name in INFEASIBLE, (path.name, r.exit_code)
    if r.exit_code == 0:
        plots = tmp_path / "plots"
        assert_instance_pngs(path, plots, [f for f in d["files"] if Path(f).parent == plots])


def test_infeasible_result_validates_and_groups_conflicts(cli):
    r = cli(INSTANCES / "qwen32b_128k.yaml", "--set", "workload.sessions.0.deadline_ms=1", "--format", "json")
    assert r.exit_code == 3
    d = json.loads(r.stdout)
    jsonschema.validate(d, SCHEMA)
    fams = [g["family"] for g in d["conflicts"]]
    assert len(fams) == len(set(fams))
    deadline = next(g for g in d["conflicts"] if g["family"] == "deadline")
    assert deadline["count"] == len(deadline["constraints"]) > 1


@pytest.mark.parametrize("path,args,requirement", [
    ("serving_llama70b_h100.yaml", ["--set", "serving.traffic.rate_rps=1e9"], "rate_rps"),
    ("supernode_deepseek_v3.yaml", ["--set", "supernode.slo_ms_per_token=1"], "slo_ms_per_token"),
    ("hgx_h100_120kw.yaml", ["--set", "buildout.target_gpus=96"], "target_gpus"),
    ("qwen32b_128k.yaml", ["--set", "workload.sessions.0.deadline_ms=1"], "on_time"),
])
def test_every_infeasible_answer_leads_with_the_best_achievable(cli, path, args, requirement):
    r = cli(INSTANCES / path, *args, "--format", "json")
    assert r.exit_code == 3, r.output
    d = json.loads(r.stdout)
    jsonschema.validate(d, SCHEMA)
    assert d["achievable"]["requirement"] == requirement and d["achievable"]["detail"]
    assert d["objective"] is not None and d["objective"]["value"] is None
    assert d["conflicts"]
