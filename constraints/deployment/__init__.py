"""The deployment problem's constraint families, one module each.

Every family module has ``FAMILY`` (its name in constraint keys, e.g. ``memory[tp2#0@s0]``),
``define(f, problem)`` (adds its named constraints to the CP-SAT formulation ``f`` of
``problem``; the formula is in the module docstring) and ``describe(key, f) -> str`` (one line
on one element, used by the explanations and infeasibility reports). The formulation defines
them in the order below: the fault and on-time families read the nominal scenario.
"""
from __future__ import annotations

from constraints.deployment import (assignment, deadline, fault, gpus_per_server, makespan, memory, on_time,
                                    symmetry)

FAMILIES_BEFORE_NOMINAL = (gpus_per_server, assignment, memory, deadline, makespan, symmetry)
FAMILIES_AFTER_NOMINAL = (fault, on_time)
BY_NAME = {m.FAMILY: m for m in (assignment, deadline, gpus_per_server, makespan, memory, on_time)}


def describe(key, f) -> str:
    """The sentence of ``key`` from its family's ``describe`` (the key itself for other families)."""
    family = BY_NAME.get(key.family)
    return family.describe(key, f) if family is not None else str(key)
