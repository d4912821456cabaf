"""Build-out fabric families: leaf/spine switch chips for the GPUs' links.

Every GPU has ``gpu_links`` links into the fabric, each taking one leaf port (a downlink).
With one tier (gpus <= one_tier_max_gpus) a leaf uses all ``switch_radix`` ports as
downlinks. With two tiers each leaf splits its ports into ``d`` downlinks and ``u``
uplinks to the spine, ``d + u <= radix`` and ``d * bw <= max_oversubscription * u * bw``
(uplink bandwidth x oversubscription >= downlink bandwidth, per leaf). The useful splits
(for each ``u`` the most downlinks it allows) are enumerated exactly in integers, and
``w[d]`` leaves use split ``d`` (the configuration formulation again, so the per-leaf
limit holds exactly, not only on average):

    radix * L1 + sum_d d * w[d] >= gpu_links * gpus      fabric_ports[leaf downlinks]
    radix * S >= sum_d u_d * w[d]                        fabric_ports[spine]
    L1 <= M * (1 - z);  sum_d w[d] <= M * z;  S <= M * z fabric_tiers[...]

Chips are integers. Each leaf and spine chip draws ``switch_power_kw`` from the hall budget
(:mod:`constraints.buildout.power`) and, when ``switch_power_kw`` or ``switch_rack_units`` is
set, is placed in a rack beside the servers (:mod:`constraints.buildout.racks`,
``rack_cover[switches]``); both default to 0 (chips then only cost ``second_tier_power_kw``,
and the first tier's switches belong in ``fixed_power_kw``).
"""
from __future__ import annotations

from fractions import Fraction
from math import floor

from optimizer.result import ConstraintKey

FAMILY = "fabric"  # the module's name in the formulation; its keys use the three families below
PORTS = "fabric_ports"
TIERS = "fabric_tiers"
OVERSUB = "fabric_oversubscription"
KEY_FAMILIES = (PORTS, TIERS, OVERSUB)
LEAF_DOWN = ConstraintKey(PORTS, "leaf downlinks")
SPINE = ConstraintKey(PORTS, "spine")
ONE_TIER = ConstraintKey(TIERS, "one tier")
TWO_TIERS = ConstraintKey(TIERS, "two tiers")
NO_SPLIT = ConstraintKey(OVERSUB, "leaf")


def leaf_splits(radix: int, max_oversubscription: Fraction) -> list[tuple[int, int]]:
    """Non-dominated (downlinks, uplinks) splits of one leaf chip in a two-tier fabric.

    For each uplink count ``u`` the most downlinks allowed is
    ``d = min(floor(max_oversubscription * u), radix - u)``; splits that add uplinks
    without adding downlinks are dropped. Returns [] when no split has a downlink.
    """
    out: list[tuple[int, int]] = []
    best = 0
    for u in range(1, radix):
        d = min(floor(max_oversubscription * u), radix - u)
        if d > best:
            out.append((d, u))
            best = d
    return out


def leaf_bandwidth(radix: int, port_bandwidth_gb_s: float, downlinks: int) -> dict[str, float]:
    """Bandwidth of one leaf chip whose ``downlinks`` ports face GPUs and the rest face the spine.

    Returns ``{"downlinks", "uplinks", "downlink_gb_s", "uplink_gb_s", "oversubscription"}``,
    bandwidths per direction in GB/s, oversubscription = downlink / uplink bandwidth
    (inf when there are no uplinks).
    Example (reference chapter): radix 64 at 25 GB/s, 32 down -> 800 GB/s up, 1:1;
    48 down -> 400 GB/s up, 3:1.
    Raises:
        ValueError: downlinks outside 0..radix.
    """
    if not 0 <= downlinks <= radix:
        raise ValueError(f"downlinks must be within 0..{radix} (got {downlinks})")
    up = radix - downlinks
    return {
        "downlinks": downlinks,
        "uplinks": up,
        "downlink_gb_s": downlinks * port_bandwidth_gb_s,
        "uplink_gb_s": up * port_bandwidth_gb_s,
        "oversubscription": (downlinks / up) if up else float("inf"),
    }


def define(model, p) -> None:
    """Add the leaf/spine port and tier constraints (module docstring) for ``p.fabric``, none
    without a fabric. ``model``: :class:`optimizer.buildout.model.BuildoutModel`."""
    f = p.fabric
    if f is None:
        return
    r = f.switch_radix
    down = sum(d * w for (d, _u), w in zip(model.splits, model.w))
    up = sum(u * w for (_d, u), w in zip(model.splits, model.w))
    model.add(LEAF_DOWN, r * model.l1 + down >= f.gpu_links * model.gpus)
    model.add(SPINE, r * model.s >= up)
    model.add(ONE_TIER, model.l1 <= model.leaf_ub * (1 - model.z))
    if model.splits:
        model.add(TWO_TIERS, sum(model.w) <= model.leaf_ub * model.z)
    model.add(TWO_TIERS, model.s <= model.leaf_ub * model.z)
    if not model.splits:
        model.add(NO_SPLIT, model.z == 0)


def describe(key: ConstraintKey, p) -> str:
    """One line on a ``fabric_ports``, ``fabric_tiers`` or ``fabric_oversubscription`` key."""
    f = p.fabric
    if key == NO_SPLIT:
        return (f"no {f.switch_radix}-port leaf split meets oversubscription {float(f.max_oversubscription):g}, "
                f"so there is no second tier")
    if key.family == PORTS:
        return f"{f.switch_radix}-port switch chips, {f.gpu_links} links per GPU"
    return "one tier up to {} GPUs, leaf/spine beyond".format(f.one_tier_max_gpus)
