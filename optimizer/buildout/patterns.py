"""Rack patterns: the ways one rack can be filled (configuration formulation of bin packing).

A pattern is a cooling kind and a count of servers per type whose power is within that
cooling's per-rack limit (:func:`constraints.buildout.rack_power.fits`) and whose height
fits the rack (:func:`constraints.buildout.rack_units.fits`), and that is *maximal*: no
further server of any type fits. Any valid rack is a sub-multiset of a maximal pattern,
so covering the servers with maximal patterns gives exactly the fewest racks.
"""
from __future__ import annotations

from dataclasses import dataclass

from constraints.buildout import rack_power
from constraints.buildout import rack_units

MAX_PATTERNS = 200_000


@dataclass(frozen=True)
class RackPattern:
    """One way to fill a rack. ``counts[i]`` servers of type i; ``power_w`` watts; ``units`` U."""

    cooling: str
    counts: tuple[int, ...]
    power_w: int
    units: int


def rack_patterns(power_w: list[int], units: list[int], caps: list[int],
                  limits_w: dict[str, int], rack_u: int) -> list[RackPattern]:
    """All maximal rack patterns.

    Args:
        power_w: per server type, watts.
        units: per server type, rack units.
        caps: per server type, the most servers of that type the plan can hold (a pattern
            never needs more).
        limits_w: per-rack power limit by cooling kind ("air", "liquid"), watts.
        rack_u: rack height, U.
    Returns:
        Patterns (non-empty, maximal), cooling kinds in the order of ``limits_w``.
    Raises:
        RuntimeError: more than MAX_PATTERNS patterns (too many server types).
    """
    out: list[RackPattern] = []
    n = len(power_w)
    for cooling, lim in limits_w.items():
        counts = [0] * n

        def rec(i: int, pw: int, uu: int) -> None:
            if i == n:
                if pw == 0 and uu == 0:
                    return
                for j in range(n):
                    if counts[j] < caps[j] and rack_power.fits(pw + power_w[j], lim) \
                            and rack_units.fits(uu + units[j], rack_u):
                        return  # not maximal
                out.append(RackPattern(cooling, tuple(counts), pw, uu))
                if len(out) > MAX_PATTERNS:
                    raise RuntimeError(f"more than {MAX_PATTERNS} rack patterns: too many server types")
                return
            c = 0
            while c <= caps[i] and rack_power.fits(pw + c * power_w[i], lim) \
                    and rack_units.fits(uu + c * units[i], rack_u):
                c += 1
            for cnt in range(c - 1, -1, -1):
                counts[i] = cnt
                rec(i + 1, pw + cnt * power_w[i], uu + cnt * units[i])
            counts[i] = 0

        rec(0, 0, 0)
    return out
