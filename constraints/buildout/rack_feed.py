"""Build-out family ``rack_feed``: a rack's load fits its power feeds (``racks.feed_kw``).

Sites specify rack power as feeds (circuits): ``feeds_per_rack`` feeds rated ``feed_kw``
each, loaded to at most ``max_utilization`` of the rating, and with ``redundant_feeds``
(A+B) the load must fit one side, i.e. half the feeds, so that losing a side drops nothing:

    usable_kw = feed_kw x max_utilization x (feeds_per_rack / 2 if redundant_feeds else feeds_per_rack)

Example: 208 V x 60 A three-phase = 208 x 60 x sqrt(3) = 21.6 kW; with the 80 % continuous-load
rule (NEC 210.20(A)/215.3: continuous loads at most 80 % of the overcurrent device rating)
and A+B feeds, 17.28 kW is usable, so one 10.2 kW HGX H100 server per rack.

Like ``rack_power`` the limit enters the model through the rack patterns (a rack's limit is
the lower of its cooling limit and the usable feed power); a server type above the usable
feed power is pinned to zero under ``rack_feed[<type>]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

SWITCHES = "switches"  # element name of the racked switch chips
FAMILY = "rack_feed"


def excludes(p, power_w: int) -> bool:
    """True when an item drawing ``power_w`` watts exceeds the usable feed power of a rack."""
    lim = p.feed_limit_w
    return lim is not None and power_w > lim


def define(model, p) -> None:
    """Pin server types (and racked switch chips) above the usable feed power to zero."""
    from constraints.buildout.rack_power import pin_unfit

    pin_unfit(model, p, FAMILY, excludes)


def feed_text(p) -> str:
    if p.feed_kw is None:
        return "no feed limit"
    ab = ", A+B: the load must fit one side" if p.redundant_feeds else ""
    return (f"{p.feeds_per_rack} x {p.feed_kw:g} kW feed{'s' if p.feeds_per_rack != 1 else ''} loaded to at most "
            f"{round(p.max_utilization * 100, 3):g} %{ab} = {round(p.feed_usable_kw, 3):g} kW usable per rack")


def describe(key: ConstraintKey, p) -> str:
    if key.element == SWITCHES:
        f = p.fabric
        return (f"one switch chip draws {f.switch_power_kw:g} kW, more than a rack's feeds allow "
                f"({feed_text(p)}): it fits no rack")
    if key.element in {t.name for t in p.types}:
        t = p.type(key.element)
        return f"one {t.name} server draws {t.power_kw:g} kW, more than a rack's feeds allow ({feed_text(p)}): it fits no rack"
    return f"per-rack feed limit ({feed_text(p)})"
