"""Build-out family ``rack_power``: a rack's servers draw at most its cooling limit.

A rack is either air or liquid cooled (``racks.air_cooled_kw`` / ``racks.liquid_cooled_kw``).
The limit enters the model through the rack patterns (:mod:`optimizer.buildout.patterns`):
only patterns whose power is within their cooling's limit exist. A server type that fits no
rack under any available cooling is pinned to zero under this family's key, so an
infeasible target names the limit.
Source: the reference chapter's rule that air cooling stops near 40 kW a rack.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "rack_power"


def fits(load_w: int, limit_w: int) -> bool:
    """True when a rack drawing ``load_w`` watts is within its cooling limit ``limit_w`` (watts)."""
    return load_w <= limit_w


def add(nm, ctx) -> None:
    """Pin server types that no available cooling can hold to zero (key ``rack_power[<type>]``)."""
    p = ctx.problem
    limits = p.cooling_limits_w()
    for t in p.types:
        if not any(fits(t.power_w, lim) for lim in limits.values()):
            nm.add(ConstraintKey(FAMILY, t.name), ctx.n[t.name] == 0)


def describe(key: ConstraintKey, p) -> str:
    lim = ", ".join(f"{c} {w / 1000:g} kW" for c, w in p.cooling_limits_w().items())
    if key.element in {t.name for t in p.types}:
        t = p.type(key.element)
        return f"one {t.name} server draws {t.power_kw:g} kW, more than any rack can cool ({lim})"
    return f"per-rack cooling limit ({lim})"
