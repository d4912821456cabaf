"""Build-out sized by what the hall delivers (issue #38 point 6): ``--objective tokens`` weighs each
server type by its delivered tokens/s for ``buildout.workload``."""
from __future__ import annotations

import dataclasses
import itertools
import json
import random

import pytest
import yaml

from optimizer.budget import Budget
from optimizer.buildout import PIPELINE
from optimizer.buildout.schema import load
from optimizer.buildout.workload import Delivered
from optimizer.result import Status
from tests.conftest import assert_one_line_error
from tests.serving_helpers import INSTANCES
from tests.test_buildout_bruteforce import brute, random_raw

HALL = INSTANCES / "hall_500kw_tokens.yaml"


def _with_tokens(p, rng: random.Random):
    """``p`` with random delivered tokens/s per server type and the tokens objective."""
    from objectives.buildout import registry

    types = tuple(dataclasses.replace(t, delivered=Delivered(float(rng.randint(0, 5000)), 0.0, "TP1", "test", None))
                  for t in p.types)
    return dataclasses.replace(p, types=types, objective=registry()["tokens"])


def _brute_tokens(p):
    """The most delivered tokens/s by enumeration: every count vector (each type up to its
    ``max_count``), feasible when brute force (which shares no code with the model) finds a plan
    with exactly those servers (caps at the counts, a GPU target at their GPUs)."""
    best = None
    for counts in itertools.product(*(range(t.max_count + 1) for t in p.types)):
        gpus = sum(c * t.gpus for c, t in zip(counts, p.types))
        q = dataclasses.replace(p, types=tuple(dataclasses.replace(t, max_count=c) for t, c in zip(p.types, counts)),
                                target_gpus=gpus or None)
        got = brute(q, "gpus")
        if got is None or -got[0] != gpus:
            continue
        tok = sum(c * t.tokens_per_s_int for c, t in zip(counts, p.types))
        best = tok if best is None else max(best, tok)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_tokens_objective_equals_brute_force(seed):
    rng = random.Random(seed)
    raw, _ = random_raw(rng)
    raw["buildout"]["target_gpus"] = None
    for t in raw["buildout"]["server_types"]:
        t["max_count"] = min(t.get("max_count", 3), 3)  # a small enumeration
    p = _with_tokens(load(raw, f"random{seed}.yaml", "gpus"), rng)
    res = PIPELINE.solve(p, Budget.seconds(20))
    want = _brute_tokens(p)
    if want is None:
        assert res.status == Status.INFEASIBLE
        return
    assert res.status == Status.OPTIMAL, (raw, res.status)
    got = sum(res.plan.servers[t.name] * t.tokens_per_s_int for t in p.types)
    assert got == want and res.value == want, raw


def test_a_hall_sized_by_gpus_is_all_h200_and_by_tokens_all_b200(cli):
    """500 kW for Llama-3.1-70B chat: the most GPUs are H200s, the most tokens/s come from B200s
    (measured steps, vLLM), and the tokens plan delivers more than the GPUs plan."""
    got = {}
    for o in ("gpus", "tokens"):
        r = cli(HALL, "--objective", o, "--format", "json")
        assert r.exit_code == 0, r.output
        got[o] = json.loads(r.stdout)
    assert got["gpus"]["plan"]["servers"] == {"hgx-h200": 47, "dgx-b200": 0}
    assert got["tokens"]["plan"]["servers"]["hgx-h200"] == 0 and got["tokens"]["plan"]["servers"]["dgx-b200"] > 0
    dv = {o: d["plan"]["delivered"] for o, d in got.items()}
    assert dv["tokens"]["tokens_per_s"] > dv["gpus"]["tokens_per_s"]
    types = dv["tokens"]["types"]
    assert types["dgx-b200"]["tokens_per_s_per_server"] > types["hgx-h200"]["tokens_per_s_per_server"]
    assert all("measured kernels" in v["timed_by"] for v in types.values())
    assert got["tokens"]["objective"]["value"] == dv["tokens"]["tokens_per_s"]  # whole tokens/s per server in both
    text = " ".join(cli(HALL, "--objective", "tokens").stdout.split())
    assert "delivers 210," in text and "dgx-b200 timed by: measured kernels" in text


def _hall() -> dict:
    raw = yaml.safe_load(HALL.read_text())
    raw["buildout"]["workload"]["model"]["config"] = str(INSTANCES / raw["buildout"]["workload"]["model"]["config"])
    return raw


def test_tokens_bad_input(cli, tmp_path):
    raw = _hall()
    del raw["buildout"]["workload"]
    p = tmp_path / "no_workload.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert_one_line_error(cli(p, "--objective", "tokens"), str(p), "buildout.workload", "tokens objective needs")
    raw = _hall()
    raw["buildout"]["server_types"].append({"name": "mybox", "gpus": 4, "power_kw": 5.0, "rack_units": 4})
    p = tmp_path / "inline.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert_one_line_error(cli(p, "--objective", "tokens"), str(p), "buildout.server_types[2].name", "cannot be timed")
    raw = _hall()
    raw["buildout"]["workload"]["model"]["config"] = "models/nope.json"
    p = tmp_path / "nope.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert_one_line_error(cli(p, "--objective", "tokens"), "buildout.workload.model.config")
