"""Compute / communication overlap timed from measurements (reference chapter 6.4.3).

Running a collective beside a GEMM does not save the shorter of the two: both slow down (they
share SMs, HBM bandwidth and the copy engines), so an overlapped pair is timed from measured
*alone* and *together* figures, never by subtracting the shorter from the sum. A measurement of
one pair at one message size gives

* the slow-down of each side when overlapped, ``s_comm = comm_together / comm_alone`` and
  ``s_compute = compute_together / compute_alone``;
* the group's own overhead, ``group - max(comm_together, compute_together)`` (launch and
  synchronisation of the two streams).

:class:`Contention` holds such points by message size and interpolates the slow-downs in log
message size (numpy's ``interp``; flat beyond the measured range). :func:`overlapped_pair_s`
then times a pair ``max(comm·s_comm, compute·s_compute) + overhead``, never above the two run one
after the other. The chapter's experiment 6-5 (a 4 MiB and a 64 MiB AllReduce beside an 11.5 ms
matmul) is the test case: 11.58 ms and 45.24 ms for the groups, savings of 2.6 and 2.7 ms, where
subtraction would claim 2.7 and 11 ms.

Micro-batch overlap in decode (two micro-batches alternating compute and All-to-All, as in
DeepSeek's inference deployment): :func:`microbatch_step_s`, with a contention factor ``kappa``
that defaults to none (1: perfect overlap) and can be calibrated from a measured pair
(:meth:`Contention.kappa`). :func:`microbatch_pair_s` is the same schedule for two halves timed
one by one (vectorised; what :class:`~optimizer.model.perf.PerfModel` uses with
``micro_batches=2``): equal to :func:`microbatch_step_s` for equal halves, never above the two
halves run one after the other.

Units: seconds and bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class OverlapPoint:
    """One measured pair at one message size (seconds; bytes)."""

    message_bytes: float
    comm_alone_s: float
    compute_alone_s: float
    comm_together_s: float
    compute_together_s: float
    group_s: float

    def __post_init__(self):
        vals = (self.message_bytes, self.comm_alone_s, self.compute_alone_s, self.comm_together_s,
                self.compute_together_s, self.group_s)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in vals):
            raise ValueError(f"an overlap measurement needs positive finite figures (got {vals})")
        if self.group_s < max(self.comm_together_s, self.compute_together_s) * (1 - 1e-9):
            raise ValueError("an overlapped group cannot end before its longer member "
                             f"({self.group_s} s < {max(self.comm_together_s, self.compute_together_s)} s)")

    @property
    def comm_slowdown(self) -> float:
        return self.comm_together_s / self.comm_alone_s

    @property
    def compute_slowdown(self) -> float:
        return self.compute_together_s / self.compute_alone_s

    @property
    def overhead_s(self) -> float:
        return self.group_s - max(self.comm_together_s, self.compute_together_s)

    @property
    def saving_s(self) -> float:
        """What overlapping saved against running the two one after the other."""
        return self.comm_alone_s + self.compute_alone_s - self.group_s


@dataclass(frozen=True)
class Contention:
    """Measured overlap points of one (collective, kernel, GPU) pair, by message size."""

    points: tuple[OverlapPoint, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if not self.points:
            raise ValueError("a contention model needs at least one measured overlap point")
        sizes = [p.message_bytes for p in self.points]
        if sorted(sizes) != sizes or len(set(sizes)) != len(sizes):
            raise ValueError("overlap points must have distinct message sizes in increasing order")

    def _at(self, message_bytes: float, attr: str) -> float:
        x = np.log([p.message_bytes for p in self.points])
        y = [getattr(p, attr) for p in self.points]
        return float(np.interp(math.log(max(message_bytes, 1.0)), x, y))

    def slowdowns(self, message_bytes: float) -> tuple[float, float, float]:
        """(communication slow-down, compute slow-down, group overhead s) at ``message_bytes``."""
        return (self._at(message_bytes, "comm_slowdown"), self._at(message_bytes, "compute_slowdown"),
                self._at(message_bytes, "overhead_s"))

    def kappa(self, message_bytes: float) -> float:
        """The contention factor of :func:`microbatch_step_s` at ``message_bytes``: the measured
        group over the longer member alone (1: the overlap is perfect)."""
        x = np.log([p.message_bytes for p in self.points])
        y = [p.group_s / max(p.comm_alone_s, p.compute_alone_s) for p in self.points]
        return float(np.interp(math.log(max(message_bytes, 1.0)), x, y))


def overlapped_pair_s(comm_s: float, compute_s: float, message_bytes: float, contention: Contention | None) -> float:
    """Time of a collective of ``comm_s`` (alone) overlapped with a kernel of ``compute_s`` (alone).

    Without measurements (``contention`` None) the ideal ``max(comm, compute)``; with them
    ``max(comm·s_comm, compute·s_compute) + overhead`` at ``message_bytes`` (module docstring),
    never more than ``comm + compute`` (the two one after the other)."""
    if contention is None:
        return max(comm_s, compute_s)
    sc, sm, over = contention.slowdowns(message_bytes)
    return min(comm_s + compute_s, max(comm_s * sc, compute_s * sm) + over)


def microbatch_step_s(compute_s: float, alltoall_s: float, layers: int, kappa: float = 1.0) -> float:
    """Decode step with two micro-batches alternating compute and All-to-All (each takes half
    of the batch): per layer each resource works on both halves, so in steady state a layer
    takes ``min(c + a, kappa·max(c, a))`` (``c``, ``a`` the layer's compute and All-to-All time
    for the whole batch, run alone); one half-layer of the shorter part fills the pipeline once.
    ``kappa`` = 1 (the default: no contention) is perfect overlap; a measured value comes from
    :meth:`Contention.kappa`.

    Args:
        compute_s, alltoall_s: one layer's times for the whole batch, alone (s).
        layers: MoE layers in the step.
    Raises:
        ValueError: ``kappa`` below 1 or not finite, negative times, layers < 1.
    """
    if not (math.isfinite(kappa) and kappa >= 1.0):
        raise ValueError(f"a contention factor is 1 (none) or more (got {kappa!r})")
    if compute_s < 0 or alltoall_s < 0 or layers < 1:
        raise ValueError("times must be >= 0 and layers >= 1")
    c, a = compute_s, alltoall_s
    return layers * min(c + a, kappa * max(c, a)) + min(c, a) / 2


MICRO_BATCHES = (1, 2)  # one batch, or DeepSeek-style two-batch overlap


def check_micro_batches(n) -> int:
    """``n`` if it is 1 (one batch per decode step) or 2 (two micro-batches overlapping compute
    with communication).

    Raises:
        ValueError: any other value (bools included).
    """
    if isinstance(n, bool) or n not in MICRO_BATCHES:
        raise ValueError(f"micro-batches per decode step must be 1 or 2 (got {n!r})")
    return int(n)


def check_kappa(kappa) -> float:
    """``kappa`` as a float if it is a finite number >= 1 (1: no contention; a measured value from
    :meth:`Contention.kappa`).

    Raises:
        ValueError: not a finite number >= 1.
    """
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not (math.isfinite(kappa) and kappa >= 1.0):
        raise ValueError(f"a contention factor is 1 (none) or more (got {kappa!r})")
    return float(kappa)


def microbatch_pair_s(work_s, comm_s, layers: int, kappa: float = 1.0):
    """Two micro-batches through ``layers`` layers, each layer's compute of one half overlapping the
    other half's collective (the schedule of :func:`microbatch_step_s`), from the halves' own
    times over all the layers, alone: ``work_s = (W1, W2)`` (compute: eq. 6-2's ``max(HBM,
    tensor-core)`` time of each half) and ``comm_s = (A1, A2)`` (its collectives). With ``c = W1 +
    W2``, ``a = A1 + A2``::

        t = min(c + a, min(c + a, max(kappa·max(c, a), W1 + A1, W2 + A2)) + min(c, a)/(2·layers))

    ``kappa·max(c, a)``: each resource works on both halves (contention ``kappa``); ``W_h + A_h``:
    a half's next layer waits for its own collective, which binds when the halves are unequal (an
    odd batch); ``min(c, a)/(2·layers)``: one half-layer of the shorter part fills the pipeline;
    ``c + a``: the two halves one after the other, an upper bound. For ``W1 = W2`` and ``A1 = A2``
    this is ``min(c + a, microbatch_step_s(c/layers, a/layers, layers, kappa))``. Scalars or arrays
    of one shape (seconds).

    Raises:
        ValueError: ``layers < 1`` or a bad ``kappa`` (:func:`check_kappa`).
    """
    kappa = check_kappa(kappa)
    if layers < 1:
        raise ValueError(f"layers must be >= 1 (got {layers})")
    w1, w2 = (np.asarray(w, dtype=np.float64) for w in work_s)
    a1, a2 = (np.asarray(x, dtype=np.float64) for x in comm_s)
    c, a = w1 + w2, a1 + a2
    serial = c + a
    steady = np.minimum(serial, np.maximum(kappa * np.maximum(c, a), np.maximum(w1 + a1, w2 + a2)))
    return np.minimum(serial, steady + np.minimum(c, a) / (2.0 * layers))
