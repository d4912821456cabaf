"""Issue 4 acceptance values (reference chapter, HGX H100 at 10.2 kW per 8-GPU server)."""
from __future__ import annotations

import pytest

from constraints.buildout.fabric import leaf_bandwidth, leaf_splits
from optimizer.buildout.evaluate import power_kw
from optimizer.buildout.patterns import rack_patterns
from optimizer.buildout.schema import load
from tests.buildout_helpers import (
    EXAMPLE,
    SECOND_TIER,
    UNITS4,
    conflict_constraints,
    conflict_texts,
    raw_of,
    report_of,
    run_json,
)


def test_120kw_gives_11_servers_88_gpus():
    code, d = run_json(EXAMPLE)
    assert code == 0
    assert d["status"] == "optimal"
    assert {k: d["objective"][k] for k in ("name", "sense", "value", "unit", "bound", "gap")} == \
        {"name": "gpus", "sense": "max", "value": 88, "unit": "GPUs", "bound": 88, "gap": 0.0}
    assert d["plan"]["servers"] == {"hgx-h100": 11}
    assert d["plan"]["gpus"] == 88
    assert d["plan"]["power_kw"] == pytest.approx(112.2)
    assert d["solver"]["gap"] == 0.0


@pytest.mark.parametrize("gpus,kw", [(64, 81.6), (72, 91.8), (96, 122.4)])
def test_gpu_counts_draw_chapter_power(gpus, kw):
    p = load(raw_of(), "x.yaml", "gpus")
    assert power_kw(p, {"hgx-h100": gpus // 8}) == pytest.approx(kw)


@pytest.mark.parametrize("objective", ["cost", "racks"])
@pytest.mark.parametrize("target,kw", [(64, 81.6), (72, 91.8)])
def test_targets_64_72_fit_with_chapter_power(objective, target, kw):
    code, d = run_json(EXAMPLE, "--objective", objective, "--set", f"buildout.target_gpus={target}")
    assert code == 0
    assert d["plan"]["gpus"] == target
    assert d["plan"]["power_kw"] == pytest.approx(kw)


@pytest.mark.parametrize("objective", ["gpus", "cost", "racks"])
def test_96_gpus_do_not_fit_120kw(objective):
    code, d = run_json(EXAMPLE, "--objective", objective, "--set", "buildout.target_gpus=96")
    assert code == 3
    assert d["status"] == "infeasible"
    assert d["plan"] is None
    assert conflict_constraints(d) == {"power[budget]", "target[gpus]"}
    assert any("122.4 kW > 120 kW" in line for line in conflict_texts(d))


def test_air_40kw_holds_at_most_3_servers():
    p = load(raw_of(buildout__racks__liquid_cooled_kw=None), "x.yaml", "gpus")
    pats = rack_patterns([t.power_w for t in p.types], [t.rack_units for t in p.types], [11],
                         p.cooling_limits_w(), p.rack_units)
    assert [(pt.cooling, pt.counts, pt.power_w) for pt in pats] == [("air", (3,), 30600)]
    assert power_kw(p, {"hgx-h100": 4}) == pytest.approx(40.8)  # 4 would draw 40.8 kW > 40
    rep = report_of(raw_of(buildout__racks__liquid_cooled_kw=None))
    d = rep.to_dict()
    assert d["plan"]["gpus"] == 88
    assert d["plan"]["racks"] == {"air": 4, "liquid": 0}  # 3 + 3 + 3 + 2
    assert max(g["servers"]["hgx-h100"] for g in d["plan"]["rack_layout"]) == 3
    rp = [b for b in d["binding"] if b["constraint"] == "rack_power[air]"]
    assert rp and "30.6 kW" in rp[0]["detail"] and "40.8 kW" in rp[0]["detail"]
    assert rp[0]["slack"] == pytest.approx(9.4)


def test_air_and_liquid_prefers_air_on_ties():
    d = report_of(raw_of()).to_dict()
    # 11 servers: fewest racks is 3 (liquid holds 5 by rack units, air 3 by power); 5 + 3 + 3 uses one liquid rack
    assert d["plan"]["racks"] == {"air": 2, "liquid": 1}
    for g in d["plan"]["rack_layout"]:
        limit = 40 if g["cooling"] == "air" else 130
        assert g["power_kw"] <= limit and g["rack_units"] <= 42


def test_second_tier_gives_80_gpus():
    code, d = run_json(SECOND_TIER)
    assert code == 0
    assert d["plan"]["gpus"] == 80
    assert d["plan"]["servers"] == {"hgx-h100": 10}
    assert d["plan"]["second_tier"] is True
    assert d["plan"]["power_kw"] == pytest.approx(112.2)  # 10 x 10.2 + 10.2
    assert "second_tier[activation]" in {b["constraint"] for b in d["binding"]}


def test_second_tier_in_units_of_4_gives_64_gpus():
    code, d = run_json(UNITS4)
    assert code == 0
    assert d["plan"]["gpus"] == 64
    assert d["plan"]["install_units"] == 2
    assert d["plan"]["second_tier"] is False
    iu = [b for b in d["binding"] if b["family"] == "install_unit"]
    assert iu and "51 kW (40.8 kW servers + 10.2 kW second tier), 38.4 kW left" in iu[0]["detail"]
    assert "80 GPUs" in iu[0]["detail"]  # single servers would reach 80


def test_switch_split_bandwidths():
    a = leaf_bandwidth(64, 25, 32)
    assert (a["uplink_gb_s"], a["oversubscription"]) == (800, 1.0)
    b = leaf_bandwidth(64, 25, 48)
    assert (b["uplink_gb_s"], b["oversubscription"]) == (400, 3.0)
    from fractions import Fraction
    assert leaf_splits(64, Fraction(1))[-1] == (32, 32)
    assert leaf_splits(64, Fraction(3))[-1] == (48, 16)


@pytest.mark.parametrize("os_,down,up_gb_s,ratio", [(1.0, 32, 800, 1.0), (3.0, 48, 400, 3.0)])
def test_fabric_in_plan_uses_chapter_splits(os_, down, up_gb_s, ratio):
    code, d = run_json(SECOND_TIER, "--set", f"buildout.fabric.max_oversubscription={os_}")
    assert code == 0
    fab = d["plan"]["fabric"]
    assert fab["tiers"] == 2 and fab["gpu_links"] == 80 * 18
    full = [g for g in fab["leaves"] if g["downlinks"] == down]
    assert full and full[0]["uplink_gb_s"] == up_gb_s and full[0]["oversubscription"] == ratio
    assert fab["oversubscription"] <= os_
    # spine ports hold every leaf uplink; leaves hold every GPU link
    assert d["plan"]["switches"]["spine"] * 64 >= fab["leaf_spine_links"]
    assert sum(g["downlinks"] * g["count"] for g in fab["leaves"]) >= fab["gpu_links"]


def test_fabric_chip_counts_1_to_1():
    d = run_json(SECOND_TIER)[1]
    # 1440 GPU links at 32 per leaf -> 45 leaves, 1440 uplinks on 64-port spines -> 23 spines
    assert d["plan"]["switches"] == {"leaf": 45, "spine": 23}
    d1 = run_json(UNITS4)[1]
    # one tier: 64 GPUs x 18 links = 1152 ports = 18 chips of 64 ports, no spine
    assert d1["plan"]["switches"] == {"leaf": 18, "spine": 0}


def test_one_more_server_message():
    d = report_of(raw_of(buildout__power_budget_kw=112.8)).to_dict()
    assert d["plan"]["gpus"] == 88
    pw = [b for b in d["binding"] if b["constraint"] == "power[budget]"][0]
    assert "one more hgx-h100 server needs 10.2 kW, 0.6 kW left" in pw["detail"]
    assert pw["slack"] == pytest.approx(0.6)


@pytest.mark.parametrize("changes,servers", [
    ({"buildout__power_budget_kw": 200, "buildout__server_types": [{"name": "dgx-b200"}]}, {"dgx-b200": 13}),
    ({"buildout__power_budget_kw": 50, "buildout__server_types": [{"name": "dgx-a100"}]}, {"dgx-a100": 7}),
    ({"buildout__fixed_power_kw": 10}, {"hgx-h100": 10}),
    ({"buildout__install_unit_servers": 3}, {"hgx-h100": 9}),
    ({"buildout__server_types": [{"name": "x", "gpus": 4, "power_kw": 3.3, "rack_units": 2, "cost": 1}]}, {"x": 36}),
])
def test_other_budgets_types_units(changes, servers):
    """Eq. 6-11 by hand: floor((P - P0) / P_server), rounded down to whole install units."""
    d = report_of(raw_of(**changes)).to_dict()
    assert d["plan"]["servers"] == servers


def test_infeasible_target_says_the_most_gpus_that_fit():
    code, d = run_json(EXAMPLE, "--set", "buildout.target_gpus=96")
    assert code == 3
    assert d["achievable"] == {"requirement": "target_gpus", "best": 88, "required": 96,
                               "detail": "at most 88 GPUs fit these limits; 96 required"}
