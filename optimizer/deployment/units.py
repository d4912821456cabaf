"""Solver units and plain types of the deployment formulation, below both the formulation and
the constraint families (so neither imports the other back).

Time resolution: one CP-SAT tick = 10 ns (:data:`TIME_UNIT_S`). Service times are rounded up
to ticks and deadlines down, so a plan the solver calls on time is on time in exact arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

TIME_UNIT_S = 1e-8  # one CP-SAT time tick = 10 ns


def ticks_up(seconds: float) -> int:
    return int(math.ceil(seconds / TIME_UNIT_S - 1e-6))


def ticks_down(seconds: float) -> int:
    return int(math.floor(seconds / TIME_UNIT_S + 1e-6))


def deadline_ticks(classes) -> list:
    """Each session class's deadline in ticks, rounded down (None: the class has no deadline)."""
    return [ticks_down(c.deadline_s) if c.deadline_s is not None else None for c in classes]


@dataclass
class Scenario:
    """One way the run can unfold: the plan without faults, or with one fault.

    Attributes:
        label: element key, e.g. ``nominal`` or ``fault0@tp2#1@s0``.
        makespan_terms: the scenario's makespan is the max of these expressions (ticks).
        on_time: expression, sessions on time.
        finish_sum: expression, sum of finish times (ticks), sequence mode only.
        enforce: literals under which the scenario happens (empty: always).
    """

    label: str
    makespan_terms: list
    on_time: object
    finish_sum: object = None
    enforce: list = field(default_factory=list)
