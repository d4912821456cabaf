"""Rack patterns: the ways one rack can be filled (configuration formulation of bin packing).

A pattern is a cooling kind and a count of items per kind (server types, and switch chips
when they take rack units or power) whose power is within that
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


def _most(free_w: int, free_u: int, power_w: int, units: int, cap: int) -> int:
    """The most items of one kind (``power_w`` W, ``units`` U each, at most ``cap``) that fit
    ``free_w`` watts and ``free_u`` units (a rack's remaining limits)."""
    c = cap
    if power_w > 0:
        c = min(c, free_w // power_w)
    if units > 0:
        c = min(c, free_u // units)
    return max(c, 0)


def rack_patterns(power_w: list[int], units: list[int], caps: list[int],
                  limits_w: dict[str, int], rack_u: int) -> list[RackPattern]:
    """All maximal rack patterns.

    Args:
        power_w: per item kind (server types, then switch chips if they take rack space), watts.
        units: per item kind, rack units.
        caps: per item kind, the most items of that kind the plan can hold (a pattern
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
                if pw == 0 and uu == 0 and not any(counts):
                    return
                for j in range(n):
                    if counts[j] < caps[j] and rack_power.fits(pw + power_w[j], lim) \
                            and rack_units.fits(uu + units[j], rack_u):
                        return  # not maximal
                out.append(RackPattern(cooling, tuple(counts), pw, uu))
                if len(out) > MAX_PATTERNS:
                    raise RuntimeError(f"more than {MAX_PATTERNS} rack patterns: too many server types")
                return
            top = _most(lim - pw, rack_u - uu, power_w[i], units[i], caps[i])
            for cnt in range(top, -1, -1):
                counts[i] = cnt
                rec(i + 1, pw + cnt * power_w[i], uu + cnt * units[i])
            counts[i] = 0

        rec(0, 0, 0)
    return out
