"""Build-out family ``rack_units``: the servers (and racked switch chips) in a rack fit its
height (``racks.rack_units``).

Like ``rack_power`` this enters the model through the rack patterns; a server type taller
than a rack is pinned to zero under ``rack_units[<type>]``:

    sum_i U_i a[p, i] <= U_rack           for every rack pattern p (enforced by enumeration)
    n[t] = 0                              rack_units[<type>], U_t > U_rack

Source: 8-GPU HGX/DGX servers are 6U-10U (see instances/hardware/buildout_servers.yaml).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

SWITCHES = "switches"  # element name of the racked switch chips
FAMILY = "rack_units"


def fits(used_u: int, rack_u: int) -> bool:
    """True when items taking ``used_u`` rack units fit a rack of ``rack_u`` units."""
    return used_u <= rack_u


def excludes(p, units: int) -> bool:
    """True when an item of ``units`` U is taller than a rack."""
    return not fits(units, p.rack_units)


def define(model, p) -> None:
    """Pin server types (and racked switch chips) taller than a rack to zero."""
    from constraints.buildout.rack_power import pin_unfit

    pin_unfit(model, p, FAMILY, excludes, size="units")


def describe(key: ConstraintKey, p) -> str:
    if key.element == SWITCHES:
        f = p.fabric
        return f"one switch chip is {f.switch_rack_units}U, taller than a {p.rack_units}U rack: it fits no rack"
    if key.element in {t.name for t in p.types}:
        t = p.type(key.element)
        return f"one {t.name} server is {t.rack_units}U, taller than a {p.rack_units}U rack: it fits no rack"
    return f"racks are {p.rack_units}U high"
