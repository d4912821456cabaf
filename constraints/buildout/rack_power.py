"""Build-out family ``rack_power``: a rack's servers (and racked switch chips) draw at most its
cooling limit.

A rack is either air or liquid cooled (``racks.air_cooled_kw`` / ``racks.liquid_cooled_kw``).
The limit enters the model through the rack patterns (:mod:`optimizer.buildout.patterns`):
only patterns whose power is within their rack's limit exist. A server type that no
available cooling can hold is pinned to zero under ``rack_power[<type>]``, so a target that
needs it is infeasible naming this key, and every plan lists the reason
(:func:`optimizer.buildout.explain.unfit_bindings`):

    sum_i P_i a[p, i] <= L_cooling(p)     for every rack pattern p (enforced by enumeration)
    n[t] = 0                              rack_power[<type>], P_t > max_c L_c
    leaves + spine = 0                    rack_power[switches], P_sw > max_c L_c

Source: the reference chapter's rule that air cooling stops near 40 kW a rack.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

SWITCHES = "switches"  # element name of the racked switch chips
FAMILY = "rack_power"


def fits(load_w: int, limit_w: int) -> bool:
    """True when a rack drawing ``load_w`` watts is within its limit ``limit_w`` (watts)."""
    return load_w <= limit_w


def excludes(p, power_w: int) -> bool:
    """True when an item drawing ``power_w`` watts exceeds every available cooling limit."""
    return not any(fits(power_w, lim) for lim in p.cooling_only_w().values())


def define(model, p) -> None:
    """Pin server types that no available cooling can hold to zero (key ``rack_power[<type>]``)."""
    pin_unfit(model, p, FAMILY, excludes)


def pin_unfit(model, p, family: str, excludes_fn, size: str = "power") -> None:
    """Pin to zero every server type, and the racked switch chips, that ``excludes_fn(p, x)``
    rules out of every rack, ``x`` being their ``size`` (``power``: watts, ``units``: rack
    units); keys ``<family>[<type>]`` and ``<family>[switches]``."""
    server_size = (lambda t: t.power_w) if size == "power" else (lambda t: t.rack_units)
    for t in p.types:
        if excludes_fn(p, server_size(t)):
            model.add(ConstraintKey(family, t.name), model.n[t.name] == 0)
    f = p.fabric
    if f is not None and f.switches_in_racks:
        switch_size = f.switch_power_w if size == "power" else f.switch_rack_units
        if excludes_fn(p, switch_size):
            model.add(ConstraintKey(family, SWITCHES), model.leaves + model.s == 0)


def limits_text(p) -> str:
    return ", ".join(f"{c} {w / 1000:g} kW" for c, w in p.cooling_only_w().items())


def describe(key: ConstraintKey, p) -> str:
    if key.element == SWITCHES:
        f = p.fabric
        return (f"one switch chip draws {f.switch_power_kw:g} kW, more than any rack can cool "
                f"({limits_text(p)}): it fits no rack")
    if key.element in {t.name for t in p.types}:
        t = p.type(key.element)
        return (f"one {t.name} server draws {t.power_kw:g} kW, more than any rack can cool "
                f"({limits_text(p)}): it fits no rack")
    return f"per-rack cooling limit ({limits_text(p)})"
