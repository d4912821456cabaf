"""Supernode family ``connection_state``: the connection state of an option's organisation fits
the NIC's on-chip cache (reference chapter section 6.5.5, :mod:`optimizer.model.connections`).

With ``H = S / server_cards`` hosts of ``A`` endpoints each, per NIC:

    pairwise:          512 A^2 (H - 1) + 32 A  <=  cache     (A = 8: H <= 8 for 256 KiB)
    endpoint+channel:   52 A   + 56 (H - 1)    <=  cache     (A = 8: H <= 4,674)

    x_o = 0      connection_state[<option label>], every option whose state exceeds the cache
"""
from __future__ import annotations

from constraints.supernode._per_option import describe as _describe, pin
from optimizer.result import ConstraintKey

FAMILY = "connection_state"
KEY_FAMILIES = (FAMILY,)


def define(model, p) -> None:
    pin(model, FAMILY)


def describe(key: ConstraintKey, p) -> str:
    return _describe(FAMILY, key, p)
