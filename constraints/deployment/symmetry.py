"""Symmetry breaking (not a user limit, so unnamed): removes plans that differ only by
relabelling interchangeable instances or servers.

* slots with the same degree on the same servers: ``used`` and load ``W`` non-increasing;
* servers (all identical): GPUs in use non-increasing, when no fault names a GPU (that
  server is then distinguished) and no instance spans servers (tied slots), or always
  with pooled slots (servers only carry counts there).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    m = f.model
    for run in f.identical_runs():
        for a, b in zip(run, run[1:]):
            m.add(f.used[a.index] >= f.used[b.index])
            m.add(f.W[a.index] >= f.W[b.index])
    if f.pooled:
        usage = getattr(f, "server_usage", [])
        for a, b in zip(usage, usage[1:]):
            if not isinstance(a, int):
                m.add(a >= b)
        return
    named_gpu = any(flt.gpu is not None for flt in f.problem.faults)
    spanning = any(len(k.servers) > 1 for k in f.slots)
    if not named_gpu and not spanning and f.problem.servers > 1:
        usage = [sum(k.gpus_each * f.used[k.index] for k in f.slots_on_server(s)) for s in range(f.problem.servers)]
        for a, b in zip(usage, usage[1:]):
            m.add(a >= b)


def describe(key: ConstraintKey, f) -> str:
    return str(key)
