"""Build-out counts the scale-up domains' fabric the supernode problem chose (issue #26 item 3):
switch chips, links and power per domain of ``cards`` GPUs, against brute force."""
from __future__ import annotations

import math
import random

import pytest
import yaml

from optimizer.buildout import PIPELINE
from optimizer.budget import Budget
from optimizer.schema_base import read_yaml
from tests.supernode_helpers import REPO

INSTANCE = REPO / "instances" / "hgx_h100_supernode_512.yaml"


def _run(raw, path, objective=None):
    p = PIPELINE.load(raw, path, objective)
    sol = PIPELINE.solve(p, Budget.unlimited())
    rep = PIPELINE.report(p, sol, PIPELINE.explain(p, sol, Budget.unlimited()))
    return p, rep.to_dict()


def test_512_card_domains_in_800_kw():
    _p, d = _run(read_yaml(INSTANCE), INSTANCE)
    plan = d["plan"]
    assert d["status"] == "optimal" and plan["gpus"] == 512
    assert plan["power_kw"] == pytest.approx(64 * 10.2 + 123.264)
    assert plan["scale_up_domains"] == {"domains": 1, "cards_per_domain": 512, "switch_chips": 432,
                                        "port_links": 18432, "power_kw": 123.264, "cost": 8006400.0,
                                        "source": plan["scale_up_domains"]["source"]}
    power = next(b for b in d["binding"] if b["constraint"] == "power[budget]")
    assert "123.264 kW for a new scale-up domain's fabric" in power["detail"]


def test_without_the_fabric_the_hall_takes_more_servers():
    raw = read_yaml(INSTANCE)
    del raw["buildout"]["scale_up_domains"]
    _p, d = _run(raw, INSTANCE)
    assert d["plan"]["gpus"] == 8 * math.floor(800 / 10.2)  # 78 servers, 624 GPUs
    assert "scale_up_domains" not in d["plan"]


@pytest.mark.parametrize("seed", range(10))
def test_domains_against_brute_force(tmp_path, seed):
    rnd = random.Random(seed)
    budget = rnd.choice([50, 120, 300])
    dom = {"cards": rnd.choice([8, 16, 32, 64]), "switch_chips": rnd.randint(0, 20), "port_links": rnd.randint(0, 500),
           "power_kw": rnd.choice([0.0, 1.5, 7.0, 25.0]), "cost": 0}
    raw = {"name": "t", "buildout": {"power_budget_kw": budget, "server_types": [{"name": "hgx-h100"}],
                                     "racks": {"air_cooled_kw": 40, "liquid_cooled_kw": 130, "rack_units": 42},
                                     "scale_up_domains": dom}}
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(raw))
    p, d = _run(raw, path)
    best = 0
    for n in range(0, int(budget / 10.2) + 1):
        domains = math.ceil(8 * n / dom["cards"])
        if 10.2 * n + dom["power_kw"] * domains <= budget + 1e-9:
            best = max(best, 8 * n)
    assert d["plan"]["gpus"] == best, seed
    sd = d["plan"]["scale_up_domains"]
    assert sd["domains"] == math.ceil(best / dom["cards"])
    assert sd["switch_chips"] == sd["domains"] * dom["switch_chips"]
