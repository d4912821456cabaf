"""Issue 8: a server type that fits no rack (by cooling power, feed power or rack units) is
named with the reason for every objective: first in the plan's binding list, or in the
conflict (exit 3) when a target needs it. Before the fix, 5 kW air racks and no liquid
cooling gave "optimal, 0 GPUs" naming only a leaf-port limit."""
from __future__ import annotations

import pytest

from tests.buildout_helpers import (
    EXAMPLE,
    MIXED,
    SECOND_TIER,
    conflict_constraints,
    conflict_texts,
    raw_of,
    run_cli,
    run_json,
    write_instance,
)

AIR5 = ["--set", "buildout.racks.air_cooled_kw=5", "--set", "buildout.racks.liquid_cooled_kw=null"]
FIT_FAMILIES = {"rack_power", "rack_feed", "rack_units"}


@pytest.mark.parametrize("path", [EXAMPLE, SECOND_TIER])
def test_5kw_racks_name_the_10_2kw_server_first(path):
    code, d = run_json(path, *AIR5)
    assert code == 0 and d["plan"]["gpus"] == 0
    first = d["binding"][0]
    assert first["constraint"] == "rack_power[hgx-h100]"
    assert "10.2 kW" in first["detail"] and "air 5 kW" in first["detail"] and "fits no rack" in first["detail"]
    assert first["slack"] == pytest.approx(5 - 10.2, abs=1e-9) and first["unit"] == "kW"
    # no leaf-port entry describing "one more server" that cannot be placed at all
    assert all(b["family"] != "fabric_ports" for b in d["binding"])


def test_5kw_racks_table_says_why_before_the_plan():
    code, out, err = run_cli(SECOND_TIER, *AIR5)
    assert code == 0 and err == ""
    head = out.split("Servers")[0]
    assert "rack_power[hgx-h100]" in head and "10.2 kW" in head


@pytest.mark.parametrize("objective", ["gpus", "cost", "racks"])
def test_5kw_racks_with_a_target_is_infeasible_naming_the_server(objective):
    code, d = run_json(EXAMPLE, *AIR5, "--objective", objective, "--set", "buildout.target_gpus=8")
    assert code == 3 and d["status"] == "infeasible"
    assert conflict_constraints(d) == {"rack_power[hgx-h100]", "target[gpus]"}
    assert any("10.2 kW" in x and "fits no rack" in x for x in conflict_texts(d))


@pytest.mark.parametrize("objective,target", [("gpus", None), ("gpus", 8), ("cost", 8), ("racks", 8)])
def test_server_taller_than_rack(objective, target):
    args = ["--set", "buildout.racks.rack_units=6", "--objective", objective]
    if target:
        args += ["--set", f"buildout.target_gpus={target}"]
    code, d = run_json(EXAMPLE, *args)
    if target:
        assert code == 3
        assert conflict_constraints(d) == {"rack_units[hgx-h100]", "target[gpus]"}
        assert any("8U, taller than a 6U rack" in x for x in conflict_texts(d))
    else:
        assert code == 0 and d["plan"]["gpus"] == 0
        assert d["binding"][0]["constraint"] == "rack_units[hgx-h100]"
        assert d["binding"][0]["slack"] == -2 and d["binding"][0]["unit"] == "U"


@pytest.mark.parametrize("objective", ["gpus", "cost", "racks"])
def test_one_unfit_type_among_several_is_listed_first(objective):
    """1 MW mixed hall with 12 kW air racks only: DGX B200 (14.3 kW) fits no rack; the plan uses
    the other types and still says why there is no B200."""
    code, d = run_json(MIXED, "--objective", objective, "--set", "buildout.racks.air_cooled_kw=12",
                       "--set", "buildout.racks.liquid_cooled_kw=null")
    assert code == 0
    assert d["plan"]["servers"]["dgx-b200"] == 0 and d["plan"]["gpus"] >= 512
    first = d["binding"][0]
    assert first["constraint"] == "rack_power[dgx-b200]" and "14.3 kW" in first["detail"]
    assert [b["constraint"] for b in d["binding"] if b["family"] in FIT_FAMILIES and b["slack"] < 0] == \
        ["rack_power[dgx-b200]"]


def test_every_unfit_reason_is_listed(tmp_path):
    """A type both too hot and too tall gets both entries; a type that fits gets none."""
    raw = raw_of(buildout__server_types=[{"name": "big", "gpus": 8, "power_kw": 150, "rack_units": 50, "cost": 1},
                                         {"name": "ok", "gpus": 4, "power_kw": 5, "rack_units": 4, "cost": 1}])
    code, d = run_json(write_instance(tmp_path, raw))
    assert code == 0
    unfit = [b["constraint"] for b in d["binding"] if b["family"] in FIT_FAMILIES and b["slack"] < 0]
    assert unfit == ["rack_power[big]", "rack_units[big]"]
    assert [b["constraint"] for b in d["binding"][:2]] == unfit
    assert d["plan"]["servers"] == {"big": 0, "ok": 24}  # floor(120 / 5)
