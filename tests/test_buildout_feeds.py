"""Issue 9: rack power as sites specify it (feeds, continuous-load derating, A+B redundancy)
and switch chips that take rack units and power."""
from __future__ import annotations

import math

import pytest

from optimizer.buildout.schema import load
from tests.buildout_helpers import (
    EXAMPLE,
    INSTANCES,
    conflict_constraints,
    conflict_texts,
    raw_of,
    report_of,
    run_cli,
    run_json,
    write_instance,
)

FEEDS = INSTANCES / "hgx_h100_feeds_208v.yaml"


def test_208v_60a_three_phase_is_21_6_kw():
    assert 208 * 60 * math.sqrt(3) / 1000 == pytest.approx(21.6, abs=0.02)


def test_feeds_instance_one_server_per_rack():
    """21.6 kW x 0.8 = 17.28 kW usable (A+B: one feed): one 10.2 kW server per rack, 11 racks."""
    code, d = run_json(FEEDS)
    assert code == 0 and d["status"] == "optimal"
    assert d["plan"]["servers"] == {"hgx-h100": 11} and d["plan"]["gpus"] == 88
    assert d["plan"]["racks"] == {"air": 11, "liquid": 0}
    assert [(g["count"], g["servers"]) for g in d["plan"]["rack_layout"]] == [(11, {"hgx-h100": 1})]
    feed = [b for b in d["binding"] if b["constraint"] == "rack_feed[air]"]
    assert feed and feed[0]["slack"] == pytest.approx(17.28 - 10.2, abs=1e-6)
    assert "17.28 kW usable" in feed[0]["detail"] and "20.4 kW" in feed[0]["detail"]
    p = load(raw_of(FEEDS), "x.yaml", "gpus")
    assert p.feed_usable_kw == pytest.approx(17.28, abs=1e-9) and p.feed_limit_w == 17280


def test_rating_without_derating_would_allow_two():
    """The wrong reading (21.6 kW usable) packs two servers (20.4 kW) per rack: 6 racks."""
    code, d = run_json(FEEDS, "--set", "buildout.racks.max_utilization=1")
    assert code == 0 and d["plan"]["racks"] == {"air": 6, "liquid": 0}
    assert max(g["servers"]["hgx-h100"] for g in d["plan"]["rack_layout"]) == 2


@pytest.mark.parametrize("changes,usable_kw,per_rack", [
    ({"redundant_feeds": True}, 17.28, 1),                               # A+B: one of 2 feeds
    ({"redundant_feeds": True, "feeds_per_rack": 4}, 34.56, 3),          # 2 A + 2 B: two feeds
    ({"redundant_feeds": False, "feeds_per_rack": 2}, 34.56, 3),         # both feeds carry load
    ({"redundant_feeds": False}, 17.28, 1),                              # one feed
    ({"redundant_feeds": True, "max_utilization": 0.5}, 10.8, 1),
    ({"redundant_feeds": True, "max_utilization": 0.4}, 8.64, 0),
])
def test_usable_feed_power(changes, usable_kw, per_rack):
    racks = {"air_cooled_kw": 40, "liquid_cooled_kw": None, "rack_units": 42, "feed_kw": 21.6,
             "max_utilization": 0.8}
    racks.update(changes)
    raw = raw_of(EXAMPLE, buildout__racks=racks)
    p = load(raw, "x.yaml", "gpus")
    assert p.feed_usable_kw == pytest.approx(usable_kw, abs=1e-9)
    d = report_of(raw).to_dict()
    # air racks hold 3 servers by cooling (30.6 kW <= 40 kW); the feeds may allow fewer
    most = max((g["servers"].get("hgx-h100", 0) for g in d["plan"]["rack_layout"]), default=0)
    assert most == min(per_rack, 3)
    if per_rack == 0:
        assert d["plan"]["gpus"] == 0 and d["binding"][0]["constraint"] == "rack_feed[hgx-h100]"
    else:
        assert d["plan"]["gpus"] == 88 and d["plan"]["racks"]["air"] == math.ceil(11 / min(per_rack, 3))


@pytest.mark.parametrize("objective", ["cost", "racks"])
def test_server_above_feed_with_target_is_infeasible(objective):
    code, d = run_json(FEEDS, "--objective", objective, "--set", "buildout.target_gpus=8",
                       "--set", "buildout.racks.max_utilization=0.4")
    assert code == 3
    assert conflict_constraints(d) == {"rack_feed[hgx-h100]", "target[gpus]"}
    assert any("8.64 kW usable" in x for x in conflict_texts(d))


@pytest.mark.parametrize("override,field,words", [
    ("buildout.racks.max_utilization=0", "buildout.racks.max_utilization", "greater than 0"),
    ("buildout.racks.max_utilization=1.2", "buildout.racks.max_utilization", "less than or equal to 1"),
    ("buildout.racks.max_utilization=null", "buildout.racks.max_utilization", "required with feed_kw"),
    ("buildout.racks.feed_kw=0", "buildout.racks.feed_kw", "greater than 0"),
    ("buildout.racks.feed_kw=-21.6", "buildout.racks.feed_kw", "greater than 0"),
    ("buildout.racks.feed_kw=null", "buildout.racks.max_utilization", "needs buildout.racks.feed_kw"),
    ("buildout.racks.feeds_per_rack=3", "buildout.racks.feeds_per_rack", "must be even"),
    ("buildout.racks.feeds_per_rack=0", "buildout.racks.feeds_per_rack", "greater than or equal to 1"),
    ("buildout.racks.redundant_feeds=maybe", "buildout.racks.redundant_feeds", "valid boolean"),
    ("buildout.racks.feed_amps=60", "buildout.racks.feed_amps", "unknown key"),
])
def test_bad_feed_field(override, field, words):
    code, out, err = run_cli(FEEDS, "--set", override)
    assert code == 2, out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {FEEDS}: {field}: ") and words in lines[0], lines[0]


# ------------------------------------------------------------------ switch chips

ONE_TIER = {"switch_radix": 64, "port_bandwidth_gb_s": 50, "gpu_links": 1, "max_oversubscription": 1.0,
            "second_tier_power_kw": 0.0, "one_tier_max_gpus": 1024}


@pytest.mark.parametrize("switch_kw,servers,power_kw", [
    (3.9, 11, 112.2 + 2 * 3.9),   # 88 GPU links on two 64-port chips: 120.0 kW fits exactly
    (4.0, 10, 102.0 + 2 * 4.0),   # 11 servers would need 120.2 kW: 10 servers (80 links, 2 chips)
    (0.0, 11, 112.2),
])
def test_switch_power_counts_in_the_budget(switch_kw, servers, power_kw):
    d = report_of(raw_of(EXAMPLE, buildout__fabric=dict(ONE_TIER, switch_power_kw=switch_kw))).to_dict()
    assert d["plan"]["servers"] == {"hgx-h100": servers}
    assert d["plan"]["switches"] == {"leaf": 2, "spine": 0}
    assert d["plan"]["power_kw"] == pytest.approx(power_kw, abs=1e-6)
    assert d["plan"]["fabric"]["switch_power_kw"] == pytest.approx(2 * switch_kw, abs=1e-9)


@pytest.mark.parametrize("budget,servers,need", [
    # 11 servers + 2 chips = 120.0 kW; a 12th (96 links) still fits two 64-port chips
    (130, 11, "one more hgx-h100 server needs 10.2 kW, 10 kW left"),
    # 8 servers = 64 links on one chip, 85.5 kW; a 9th (72 links) needs a second chip
    (90, 8, "one more hgx-h100 server needs 14.1 kW (10.2 kW servers + 3.9 kW switch chips), 4.5 kW left"),
])
def test_next_server_message_counts_switch_power(budget, servers, need):
    d = report_of(raw_of(EXAMPLE, buildout__fabric=dict(ONE_TIER, switch_power_kw=3.9),
                         buildout__power_budget_kw=budget)).to_dict()
    assert d["plan"]["servers"] == {"hgx-h100": servers}
    pw = [b for b in d["binding"] if b["constraint"] == "power[budget]"][0]
    assert need in pw["detail"], pw["detail"]


def test_switch_rack_units_take_rack_space():
    """Air racks only (3 servers each): 11 servers need 4 racks; two 20U switch chips do not
    fit beside 3 servers (24U + 20U > 42U), so the fewest racks is 5 (3, 3, 3, 1 + chip, 1 + chip)."""
    base = {"air_cooled_kw": 40, "liquid_cooled_kw": None, "rack_units": 42}
    d0 = report_of(raw_of(EXAMPLE, buildout__racks=base, buildout__fabric=dict(ONE_TIER))).to_dict()
    assert d0["plan"]["racks"] == {"air": 4, "liquid": 0}
    d = report_of(raw_of(EXAMPLE, buildout__racks=base,
                         buildout__fabric=dict(ONE_TIER, switch_rack_units=20, switch_power_kw=0.5))).to_dict()
    assert d["plan"]["servers"] == {"hgx-h100": 11} and d["plan"]["racks"] == {"air": 5, "liquid": 0}
    assert sum(g["count"] * g["switch_chips"] for g in d["plan"]["rack_layout"]) == 2
    for g in d["plan"]["rack_layout"]:
        assert g["rack_units"] <= 42 and g["power_kw"] <= 40


def test_switch_taller_than_rack_is_named():
    code, d = run_json(write_instance_tmp(raw_of(EXAMPLE, buildout__fabric=dict(ONE_TIER, switch_rack_units=50))))
    assert code == 0 and d["plan"]["gpus"] == 0
    assert d["binding"][0]["constraint"] == "rack_units[switches]"


def write_instance_tmp(raw):
    import tempfile
    from pathlib import Path
    return write_instance(Path(tempfile.mkdtemp()), raw)


@pytest.mark.parametrize("override,field,words", [
    ("buildout.fabric.switch_power_kw=-1", "buildout.fabric.switch_power_kw", "greater than or equal to 0"),
    ("buildout.fabric.switch_rack_units=1.5", "buildout.fabric.switch_rack_units", "valid integer"),
])
def test_bad_switch_field(override, field, words):
    from tests.buildout_helpers import SECOND_TIER
    code, _out, err = run_cli(SECOND_TIER, "--set", override)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"error: {SECOND_TIER}: {field}: " in err and words in err, err


def test_switch_taller_than_rack_with_target_is_infeasible():
    raw = raw_of(EXAMPLE, buildout__fabric=dict(ONE_TIER, switch_rack_units=50), buildout__target_gpus=8)
    code, d = run_json(write_instance_tmp(raw), "--objective", "racks")
    assert code == 3
    assert conflict_constraints(d) == {"rack_units[switches]", "target[gpus]", "fabric_ports[leaf downlinks]"}
    assert any("one switch chip is 50U, taller than a 42U rack" in x for x in conflict_texts(d))


def test_switches_is_a_reserved_server_name():
    code, _out, err = run_cli(EXAMPLE, "--set", "buildout.server_types=[{name: switches, gpus: 1, power_kw: 1, rack_units: 1}]")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"error: {EXAMPLE}: buildout.server_types: " in err and "'switches' is reserved" in err
