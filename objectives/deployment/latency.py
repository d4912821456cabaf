"""Objective ``latency`` (ms): mean session finish time over all sessions (late ones
included); with faults, the worst case over the fault scenarios. Needs the sequence
formulation (finish times depend on the order on each instance)."""
from __future__ import annotations

NAME = "latency"
UNIT = "ms"


def apply(f) -> None:
    lw = f.model.new_int_var(0, f.horizon * max(1, f.n_sessions), "worst_finish_sum")
    for sc in f.scenarios:
        ct = f.model.add(lw >= sc.finish_sum)
        if sc.enforce:
            ct.only_enforce_if(sc.enforce)
    f.model.minimize(lw)


def value(evaluation) -> float:
    return evaluation.worst.mean_finish_s * 1e3
