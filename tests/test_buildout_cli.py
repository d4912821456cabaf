"""The build-out CLI end to end: table and JSON output, exit codes, conflicts, the docs' commands."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from optimizer.buildout.schema import SERVERS_FILE, load_server_data
from tests.buildout_helpers import (
    EXAMPLE,
    MIXED,
    REPO,
    SECOND_TIER,
    UNITS4,
    conflict_constraints,
    conflict_texts,
    raw_of,
    run_cli,
    run_json,
    write_instance,
)


@pytest.mark.parametrize("path", [EXAMPLE, SECOND_TIER, UNITS4, MIXED])
@pytest.mark.parametrize("objective", ["gpus", "cost", "racks"])
def test_every_instance_and_objective_runs(path, objective):
    args = [path, "--objective", objective]
    if objective != "gpus" and yaml.safe_load(path.read_text())["buildout"]["target_gpus"] is None:
        args += ["--set", "buildout.target_gpus=64"]
    code, d = run_json(*args)
    assert code == 0, d
    assert d["status"] == "optimal"
    assert set(d) >= {"status", "objective", "plan", "binding", "solver"}
    assert set(d["objective"]) >= {"name", "value", "unit"}
    assert set(d["plan"]) >= {"servers", "gpus", "power_kw", "racks", "switches", "install_units"}
    assert set(d["plan"]["racks"]) == {"air", "liquid"} and set(d["plan"]["switches"]) == {"leaf", "spine"}
    assert set(d["solver"]) >= {"name", "time_s", "gap", "bound"}
    for b in d["binding"]:
        assert set(b) >= {"constraint", "family", "slack", "detail"}
    assert d["plan"]["power_kw"] <= d["plan"]["power_budget_kw"] + 1e-9
    if objective != "gpus":
        assert d["plan"]["gpus"] >= (yaml.safe_load(path.read_text())["buildout"]["target_gpus"] or 64)


def test_table_output_names_binding_limit():
    code, out, err = run_cli(EXAMPLE)
    assert code == 0 and err == ""
    assert "88" in out and "112.2" in out
    assert "power[budget]" in out  # rich markup must not eat the brackets
    assert re.search(r"one more hgx-h100 server needs\s+10\.2\s+kW", out)


def test_infeasible_table_exit_3():
    code, out, _err = run_cli(EXAMPLE, "--set", "buildout.target_gpus=96")
    assert code == 3
    assert "power[budget]" in out and "target[gpus]" in out


def test_server_too_hot_for_any_rack_conflict(tmp_path):
    raw = raw_of(buildout__server_types=[{"name": "hot", "gpus": 8, "power_kw": 45, "rack_units": 8}],
                 buildout__racks={"air_cooled_kw": 40, "liquid_cooled_kw": None, "rack_units": 42},
                 buildout__target_gpus=8, buildout__power_budget_kw=500)
    code, d = run_json(write_instance(tmp_path, raw), "--objective", "racks")
    assert code == 3
    assert conflict_constraints(d) == {"rack_power[hot]", "target[gpus]"}
    assert any("45 kW" in x for x in conflict_texts(d))


def test_max_count_conflict():
    code, d = run_json(EXAMPLE, "--objective", "cost", "--set", "buildout.target_gpus=64",
                       "--set", "buildout.server_types.0.max_count=4")
    assert code == 3
    assert conflict_constraints(d) == {"max_count[hgx-h100]", "target[gpus]"}


def test_fixed_power_above_budget_is_infeasible():
    code, d = run_json(EXAMPLE, "--set", "buildout.fixed_power_kw=130")
    assert code == 3 and conflict_constraints(d) == {"power[budget]"}
    # with the best achievable (a fresh user got none): no server, 10 kW of budget short
    a = d["achievable"]
    assert a["requirement"] == "power_budget_kw" and a["best"] == 0 and "10 kW more budget" in a["detail"]


def test_zero_gpu_plan_when_nothing_fits():
    code, d = run_json(EXAMPLE, "--set", "buildout.power_budget_kw=5")
    assert code == 0 and d["plan"]["gpus"] == 0 and d["plan"]["racks"] == {"air": 0, "liquid": 0}


def test_json_is_one_object_on_stdout():
    code, out, err = run_cli(MIXED, "--format", "json")
    assert code == 0 and err == ""
    d = json.loads(out)
    assert d["problem"] == "buildout"
    assert d["solver"]["name"] == "cp-sat" and d["solver"]["status"] == "optimal"


def test_data_file_has_sources_and_agrees_with_catalog():
    servers, unit = load_server_data(SERVERS_FILE)
    assert set(servers) >= {"hgx-h100", "hgx-h200", "dgx-b200", "dgx-a100"}
    for name, s in servers.items():
        assert s["source"].strip(), name
        assert "cost" in s["source"], f"{name}: the source must say where the cost comes from"
    cat = REPO / "instances" / "hardware" / "catalog.yaml"
    if not cat.exists():
        pytest.skip("hardware catalog not present")
    catalog = yaml.safe_load(cat.read_text())["servers"]
    for name, s in servers.items():
        if name in catalog:
            assert catalog[name]["gpus"] == s["gpus"], name
            assert catalog[name]["power_kw"] == pytest.approx(s["power_kw"]), name


def _doc_commands() -> list[list[str]]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    cmds = []
    lines = [ln for d in docs for ln in d.read_text().splitlines()]
    for line in lines:
        line = line.split(" #")[0].strip().removeprefix("$ ")
        if line.startswith("optimize ") and "instances/" in line and "|" not in line:
            parts = line.split()[1:]
            inst = parts[0]
            if (REPO / inst).exists() and yaml.safe_load((REPO / inst).read_text()).get("buildout"):
                cmds.append(parts)
    return cmds


def test_documented_commands_run():
    cmds = _doc_commands()
    if not cmds:
        pytest.fail("README.md and docs/ document no build-out command")
    for parts in cmds:
        args = [str(REPO / parts[0])] + parts[1:]
        code, _out, err = run_cli(*args)
        assert code in (0, 3), (parts, err)


def test_tiny_time_limit_still_reports_honestly():
    code, d = run_json(MIXED, "--time-limit", "0.001")
    assert code in (0, 4)
    if code == 0:
        assert d["status"] in ("optimal", "feasible") and d["plan"] is not None
        if d["status"] == "optimal":
            assert all(s["status"] == "optimal" for s in d["solver"]["stages"])
    else:
        assert d["status"] == "time_limit" and d["plan"] is None


def test_rack_layout_holds_exactly_the_plan_servers():
    """The model covers servers with maximal rack patterns; the reported layout must be
    what is installed: exactly the plan's servers (95 kW: 9 servers, not 2 x 5)."""
    code, d = run_json(EXAMPLE, "--set", "buildout.power_budget_kw=95")
    assert code == 0
    placed = sum(g["count"] * g["servers"].get("hgx-h100", 0) for g in d["plan"]["rack_layout"])
    assert placed == d["plan"]["servers"]["hgx-h100"] == 9
    assert sum(g["count"] for g in d["plan"]["rack_layout"]) == d["plan"]["racks"]["air"] + d["plan"]["racks"]["liquid"]
