"""Supernode family ``fabric_ports``: an option's candidate fabric must be buildable from the
card's ports and the switch chip's ports.

A torus of D dimensions takes ``2 D <= card_ports`` ports; a switched fabric ``ports_per_card <=
card_ports``; one level joins at most ``switch_ports`` cards; at two levels ``down + up <=
switch_ports`` and the leaves of a plane fit one spine's ports (:class:`optimizer.model.fabric.Switched`).

    x_o = 0      fabric_ports[<option label>], every option whose fabric cannot be built
"""
from __future__ import annotations

from constraints.supernode._per_option import describe as _describe, pin
from optimizer.result import ConstraintKey

FAMILY = "fabric_ports"
KEY_FAMILIES = (FAMILY,)


def define(model, p) -> None:
    pin(model, FAMILY)


def describe(key: ConstraintKey, p) -> str:
    return _describe(FAMILY, key, p)
