"""Bad build-out input: exit code 2 and one line naming the file, the field and the problem."""
from __future__ import annotations

import pytest

from tests.buildout_helpers import EXAMPLE, SECOND_TIER, raw_of, run_cli, write_instance


@pytest.mark.parametrize("override,field,words", [
    ("buildout.power_budget_kw=-5", "buildout.power_budget_kw", "greater than 0"),
    ("buildout.power_budget_kw=abc", "buildout.power_budget_kw", "valid number"),
    ("buildout.fixed_power_kw=-1", "buildout.fixed_power_kw", "greater than or equal to 0"),
    # a fresh user's 1e12 kW hall: CP-SAT's integer watts overflowed and a stage came back
    # infeasible under a "time limit" line; power figures are capped at 10 GW
    ("buildout.power_budget_kw=1e12", "buildout.power_budget_kw", "less than or equal to 10000000"),
    ("buildout.racks.liquid_cooled_kw=2e7", "buildout.racks.liquid_cooled_kw", "less than or equal to 10000000"),
    ("buildout.bogus=1", "buildout.bogus", "unknown key"),
    ("buildout.racks.rack_units=4.5", "buildout.racks.rack_units", "valid integer"),
    ("buildout.racks.air_cooled_kw=0", "buildout.racks.air_cooled_kw", "greater than 0"),
    ("buildout.target_gpus=true", "buildout.target_gpus", "valid integer"),
    ("buildout.install_unit_servers=0", "buildout.install_unit_servers", "greater than or equal to 1"),
    ("buildout.server_types=[]", "buildout.server_types", "at least 1"),
    ("buildout.server_types.0.name=foo", "buildout.server_types[0].name", "'foo' is not in"),
    ("buildout.server_types.0.max_count=-1", "buildout.server_types[0].max_count", "greater than or equal to 0"),
    ("buildout.server_types=[{name: a, gpus: 8, power_kw: 5}]", "buildout.server_types[0].rack_units", "inline"),
    ("buildout.server_types=[{name: hgx-h100}, {name: hgx-h100}]", "buildout.server_types", "listed twice"),
    ("buildout.racks={air_cooled_kw: null, rack_units: 42}", "buildout.racks", "no cooling available"),
    ("buildout.fabric={switch_radix: 64}", "buildout.fabric.port_bandwidth_gb_s", "required field is missing"),
    ("extra_section=1", "extra_section", "unknown key"),
])
def test_bad_field_exit_2_one_line(override, field, words):
    code, out, err = run_cli(EXAMPLE, "--set", override)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"error: {EXAMPLE}: ")
    assert f": {field}: " in line and words in line, line
    assert "Traceback" not in out + err


@pytest.mark.parametrize("objective", ["cost", "racks"])
def test_target_required_for_cost_and_racks(objective):
    code, _out, err = run_cli(EXAMPLE, "--objective", objective)
    assert code == 2
    assert err.strip() == f"error: {EXAMPLE}: buildout.target_gpus: the {objective} objective needs a target_gpus"


def test_unknown_objective():
    code, _out, err = run_cli(EXAMPLE, "--objective", "speed")
    assert code == 2 and "--objective: unknown objective 'speed'" in err and len(err.strip().splitlines()) == 1


def test_cost_objective_needs_costs(tmp_path):
    raw = raw_of(buildout__server_types=[{"name": "x", "gpus": 8, "power_kw": 10.2, "rack_units": 8}],
                 buildout__target_gpus=16)
    code, _out, err = run_cli(write_instance(tmp_path, raw), "--objective", "cost")
    assert code == 2 and "buildout.server_types[0].cost: the cost objective needs a cost" in err


def test_missing_file_and_bad_yaml(tmp_path):
    code, _o, err = run_cli(tmp_path / "nope.yaml")
    assert code == 2 and "file not found" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("buildout: [unclosed\n")
    code, _o, err = run_cli(bad)
    assert code == 2 and "not valid YAML" in err and len(err.strip().splitlines()) == 1


def test_inline_override_of_catalog_figure():
    code, out, _ = run_cli(EXAMPLE, "--set", "buildout.server_types.0.power_kw=12", "--format", "json")
    import json
    d = json.loads(out)
    assert code == 0 and d["plan"]["servers"] == {"hgx-h100": 10}  # floor(120 / 12)
    assert "overridden inline: power_kw" in d["plan"]["sources"]["hgx-h100"]


@pytest.mark.parametrize("override,field,words", [
    ("buildout.fabric.switch_radix=1", "buildout.fabric.switch_radix", "greater than or equal to 2"),
    ("buildout.fabric.max_oversubscription=0", "buildout.fabric.max_oversubscription", "greater than 0"),
    ("buildout.fabric.gpu_links=0", "buildout.fabric.gpu_links", "greater than or equal to 1"),
    ("buildout.fabric.second_tier_power_kw=-1", "buildout.fabric.second_tier_power_kw", "greater than or equal to 0"),
    ("buildout.fabric.speed=1", "buildout.fabric.speed", "unknown key"),
])
def test_bad_fabric_field(override, field, words):
    code, _out, err = run_cli(SECOND_TIER, "--set", override)
    assert code == 2
    assert err.strip() == err.strip().splitlines()[0]
    assert f"error: {SECOND_TIER}: {field}: " in err and words in err, err
