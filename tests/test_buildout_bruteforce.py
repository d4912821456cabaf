"""Property test: on random small instances the solver equals brute force.

The brute force shares no code with the model: it enumerates every server count vector
(whole install units within the budget), packs racks by a memoised search over rack
contents, and sizes the fabric by a dynamic programme over leaf chips. It checks the
primary objective, then the secondary ones in the same lexicographic order as the solver
(racks, liquid racks, cost, power, switch chips, leaf-spine links).
"""
from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from functools import lru_cache

import pytest

from optimizer.budget import Budget
from optimizer.buildout import PIPELINE
from optimizer.buildout.schema import load
from optimizer.result import Status


def random_raw(rng: random.Random) -> tuple[dict, str]:
    n_types = rng.choice([1, 1, 2, 2, 3])
    types = []
    for i in range(n_types):
        t = {"name": f"s{i}", "gpus": rng.choice([1, 2, 4, 8]), "power_kw": rng.randint(20, 120) / 10,
             "rack_units": rng.randint(2, 10), "cost": rng.randint(1, 20) * 1000}
        if rng.random() < 0.2:
            t["max_count"] = rng.randint(0, 4)
        types.append(t)
    objective = rng.choice(["gpus", "cost", "racks"])
    b = {
        "power_budget_kw": float(rng.randint(10, 50)),
        "fixed_power_kw": rng.choice([0.0, 0.0, 1.5, 4.0]),
        "server_types": types,
        "install_unit_servers": rng.choice([1, 1, 2, 3]),
        "target_gpus": rng.randint(1, 14) if objective != "gpus" or rng.random() < 0.2 else None,
        "racks": {"air_cooled_kw": rng.choice([None, 8.0, 12.5, 20.0]),
                  "liquid_cooled_kw": rng.choice([None, 25.0, 40.0]), "rack_units": rng.randint(8, 24)},
    }
    if b["racks"]["air_cooled_kw"] is None and b["racks"]["liquid_cooled_kw"] is None:
        b["racks"]["air_cooled_kw"] = 15.0
    if rng.random() < 0.5:
        b["fabric"] = {"switch_radix": rng.randint(3, 8), "port_bandwidth_gb_s": 25.0,
                       "gpu_links": rng.randint(1, 2), "max_oversubscription": rng.choice([0.5, 1.0, 1.5, 2.0, 3.0]),
                       "second_tier_power_kw": rng.choice([0.0, 1.0, 3.5]), "one_tier_max_gpus": rng.randint(2, 12)}
    return {"name": "random", "buildout": b}, objective


def random_raw_feeds(rng: random.Random) -> tuple[dict, str]:
    """Small random instances with rack feeds and switch chips that take rack units and power."""
    raw, objective = random_raw(rng)
    b = raw["buildout"]
    for t in b["server_types"]:
        t["gpus"] = rng.choice([1, 2, 4])
    if rng.random() < 0.7:
        redundant = rng.random() < 0.5
        b["racks"].update(feed_kw=rng.choice([5.0, 8.0, 21.6]), max_utilization=rng.choice([0.5, 0.8, 1.0]),
                          redundant_feeds=redundant, feeds_per_rack=rng.choice([2, 4] if redundant else [1, 2]))
    b["fabric"] = {"switch_radix": rng.randint(6, 10), "port_bandwidth_gb_s": 25.0, "gpu_links": 1,
                   "max_oversubscription": rng.choice([1.0, 2.0, 3.0]),
                   "second_tier_power_kw": rng.choice([0.0, 1.0]), "one_tier_max_gpus": rng.randint(4, 16),
                   "switch_power_kw": rng.choice([0.0, 0.4, 1.2]), "switch_rack_units": rng.choice([0, 1, 2, 4])}
    return raw, objective


def rack_limit_w(p, cooling_kw: float) -> int:
    """A rack's limit in W: its cooling, or its usable feed power (A+B: half the feeds) if lower."""
    lim = cooling_kw
    if p.feed_kw is not None:
        feeds = p.feeds_per_rack // 2 if p.redundant_feeds else p.feeds_per_rack
        lim = min(lim, p.feed_kw * p.max_utilization * feeds)
    return math.floor(lim * 1000 + 1e-6)


def brute_racks(p, counts: tuple[int, ...]) -> tuple[int, int] | None:
    """Fewest (racks, liquid racks) holding ``counts`` items per kind (server types, then switch
    chips when they are racked); None if impossible."""
    limits = {"air": p.air_cooled_kw, "liquid": p.liquid_cooled_kw}
    pw = [round(t.power_kw * 1000) for t in p.types]
    ru = [t.rack_units for t in p.types]
    if len(counts) > len(p.types):
        pw.append(round(p.fabric.switch_power_kw * 1000))
        ru.append(p.fabric.switch_rack_units)
    lim_w = {c: rack_limit_w(p, v) for c, v in limits.items() if v is not None}

    def fits(c, cooling):
        return (sum(a * b for a, b in zip(c, pw)) <= lim_w[cooling]
                and sum(a * b for a, b in zip(c, ru)) <= p.rack_units)

    @lru_cache(maxsize=None)
    def f(v):
        if not any(v):
            return (0, 0)
        best = None
        first = next(i for i, x in enumerate(v) if x)
        for c in itertools.product(*(range(x + 1) for x in v)):
            if c[first] == 0:  # some rack holds an item of the first kind left: let it be this one
                continue
            for cooling in lim_w:
                if fits(c, cooling):
                    rest = f(tuple(a - b for a, b in zip(v, c)))
                    if rest is None:
                        continue
                    cand = (rest[0] + 1, rest[1] + (cooling == "liquid"))
                    if best is None or cand < best:
                        best = cand
        return best

    return f(counts)


def brute_fabric(p, gpus: int) -> tuple[int, int] | None:
    """(switch chips, leaf-spine links) lexicographically least for ``gpus`` GPUs; None if impossible."""
    f = p.fabric
    r, links = f.switch_radix, f.gpu_links * gpus
    if gpus <= f.one_tier_max_gpus:
        return (math.ceil(links / r), 0)
    os_ = Fraction(str(f.max_oversubscription))
    # a leaf with d downlinks needs ceil(d / os) uplinks and d + u <= radix
    ups = {d: math.ceil(Fraction(d) / os_) for d in range(0, r + 1)}
    ds = [d for d in ups if d + ups[d] <= r]
    dmax = max(ds)
    if dmax == 0:
        return None
    best = None
    lmin = math.ceil(links / dmax)
    for n_leaves in range(lmin, lmin + r + 1):
        # min uplinks for n_leaves leaves covering `links` downlinks (DP over leaves)
        inf = float("inf")
        dp = [0] + [inf] * links
        for _ in range(n_leaves):
            nd = [inf] * (links + 1)
            for have, cost in enumerate(dp):
                if cost == inf:
                    continue
                for d in ds:
                    h = min(links, have + d)
                    if cost + ups[d] < nd[h]:
                        nd[h] = cost + ups[d]
            dp = nd
        u = dp[links]
        cand = (n_leaves + math.ceil(u / r), u)
        if best is None or cand < best:
            best = cand
    return best


def brute(p, objective):
    """Lexicographic optimum by enumeration: (primary, racks, liquid, cost, power_w, chips, links) or None."""
    budget_w = round(p.power_budget_kw * 1000)
    fixed_w = round(p.fixed_power_kw * 1000)
    u = p.install_unit_servers
    ranges = []
    for t in p.types:
        top = (budget_w - fixed_w) // round(t.power_kw * 1000) if budget_w >= fixed_w else 0
        if t.max_count is not None:
            top = min(top, t.max_count)
        ranges.append(range(0, max(top, 0) + 1, u))
    best = None
    for counts in itertools.product(*ranges):
        gpus = sum(c * t.gpus for c, t in zip(counts, p.types))
        power = fixed_w + sum(c * round(t.power_kw * 1000) for c, t in zip(counts, p.types))
        chips = (0, 0)
        items = counts
        if p.fabric is not None:
            if gpus > p.fabric.one_tier_max_gpus:
                power += round(p.fabric.second_tier_power_kw * 1000)
            fab = brute_fabric(p, gpus)
            if fab is None:
                continue
            chips = fab  # fewest chips: never more racks or power than more chips would need
            power += fab[0] * round(p.fabric.switch_power_kw * 1000)
            if p.fabric.switch_power_kw > 0 or p.fabric.switch_rack_units > 0:
                items = counts + (fab[0],)
        if power > budget_w or (p.target_gpus is not None and gpus < p.target_gpus):
            continue
        racks = brute_racks(p, items)
        if racks is None:
            continue
        cost = sum(c * round(t.cost * 100) for c, t in zip(counts, p.types))
        primary = {"gpus": -gpus, "cost": cost, "racks": racks[0]}[objective]
        key = (primary, racks[0], racks[1], cost, power) + chips
        if best is None or key < best:
            best = key
    return best


@pytest.mark.parametrize("gen,seed", [(random_raw, s) for s in range(100)]
                         + [(random_raw_feeds, 1000 + s) for s in range(60)])
def test_solver_equals_brute_force(gen, seed):
    rng = random.Random(seed)
    raw, objective = gen(rng)
    p = load(raw, f"random{seed}.yaml", objective)
    obj = p.objective.name
    res = PIPELINE.solve(p, Budget.seconds(20))
    want = brute(p, obj)
    if want is None:
        assert res.status == Status.INFEASIBLE, (raw, objective)
        assert res.conflict, "an infeasible instance names conflicting constraints"
        return
    assert res.status == Status.OPTIMAL, (raw, objective, res.status)
    ev = PIPELINE.evaluate(p, res.plan)
    assert ev == res.evaluation
    assert ev.violations == [], ev.violations
    counts = tuple(res.plan.servers[t.name] for t in p.types)
    cost = sum(c * round(t.cost * 100) for c, t in zip(counts, p.types))
    power = round(ev.power_kw * 1000)
    primary = {"gpus": -ev.gpus, "cost": cost, "racks": ev.racks["air"] + ev.racks["liquid"]}[obj]
    got = (primary, ev.racks["air"] + ev.racks["liquid"], ev.racks["liquid"], cost, power)
    if p.fabric is not None:
        got += (ev.leaves + ev.spine, ev.uplinks)
    else:
        got += (0, 0)
    assert got == want, (raw, objective)
    # the reported objective is the brute-force optimum
    assert res.value == pytest.approx({"gpus": ev.gpus, "cost": cost / 100,
                                       "racks": got[1]}[obj])
