"""Day-plan input: the traffic's windows and the cost of starting a worker.

Two ways to give the windows (``serving.traffic``):

* ``windows: [{length_min, rate_rps, isl, osl}, ...]`` (or ``classes`` instead of ``isl``/``osl``,
  as for steady traffic): each window's length (minutes), rate (requests/s, 0 allowed: nothing
  to serve) and lengths mix; its simulation is Poisson at its rate.
* ``trace: FILE`` with ``window_min: 5``: the trace cut into windows of that length from its first
  arrival (``ceil`` of the span: the last window has the nominal length even when the trace stops
  earlier). A window's rate is its request count / its length, its lengths mix its own requests
  (64 quantile points, as :func:`optimizer.serving.schema._traffic` does for a whole trace) and its
  simulation replays its own arrivals (shifted to start at 0, not scaled).

``serving.startup``: ``min_uptime_min`` (a started worker stays up at least that long; 0: one
window), ``load_s`` (seconds from start to serving, every configuration) or ``storage_gb_s`` with
``engine_start_s`` (``load_s = engine_start_s + weight bytes of the worker / (storage_gb_s·1e9)``:
the worker reads its whole weights, every shard, at that bandwidth). Absent: starting is free and
instant. A worker being loaded holds its GPUs without serving: its start-up GPU-hours are
``g·load_s/3600`` per start.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from optimizer.errors import InputError

GB = 1e9
MAX_WINDOWS = 2016  # a week of 5-minute windows
QUANTILE_POINTS = 64


@dataclass(frozen=True)
class Window:
    """One window of the day.

    Attributes:
        index: 0-based position (reports say ``window index + 1``).
        start_s: start from the day's start, s; length_s: its length, s.
        rate: requests/s the window's workers must carry (trace: its requests / length_s).
        traffic: its lengths mix (:class:`~optimizer.serving.schema.Traffic`); a trace window's
            also holds its arrivals (from 0) and their lengths.
        requests: a trace window's request count (None for a listed window).
    """

    index: int
    start_s: float
    length_s: float
    rate: float
    traffic: object
    requests: Optional[int] = None

    @property
    def name(self) -> str:
        return f"window {self.index + 1}"


@dataclass(frozen=True)
class Startup:
    """Resolved ``serving.startup``: ``min_uptime_s`` (s), and either ``load_s`` (s, every
    configuration) or ``storage_bytes_per_s`` with ``engine_start_s`` (see the module docstring)."""

    min_uptime_s: float = 0.0
    load_s: Optional[float] = None
    storage_bytes_per_s: Optional[float] = None
    engine_start_s: float = 0.0

    def load_s_of(self, perf, layout) -> float:
        """Seconds from starting a worker of ``layout`` (its pool's ``perf``: weight bytes) to serving."""
        if self.load_s is not None:
            return self.load_s
        if self.storage_bytes_per_s is None:
            return 0.0
        return self.engine_start_s + perf.weight_bytes_total(layout) / self.storage_bytes_per_s


def startup_of(si, path: Path) -> Startup:
    """The resolved :class:`Startup` of ``serving.startup`` (None: free, instant starts).

    Raises:
        InputError: both ``load_s`` and ``storage_gb_s``, or ``engine_start_s`` without ``storage_gb_s``.
    """
    if si is None:
        return Startup()
    if si.load_s is not None and si.storage_gb_s is not None:
        raise InputError(path, "serving.startup.load_s", "give load_s or storage_gb_s (load_s derived from the "
                                                         "weights), not both")
    if si.engine_start_s and si.storage_gb_s is None:
        raise InputError(path, "serving.startup.engine_start_s", "goes with storage_gb_s (load_s already holds the "
                                                                 "whole start-up)")
    return Startup(si.min_uptime_min * 60.0, si.load_s,
                   None if si.storage_gb_s is None else si.storage_gb_s * GB, si.engine_start_s)


def _mix(Traffic, isl: np.ndarray, osl: np.ndarray, source: str, arrivals=None):
    """A ``Traffic`` of the requests ``(isl, osl)``: at most 64 weighted quantile points of
    each marginal (as a whole trace's), with the requests themselves when ``arrivals`` is given."""
    qs = (np.arange(QUANTILE_POINTS) + 0.5) / QUANTILE_POINTS
    isl_q = np.quantile(isl, qs, method="inverted_cdf").astype(float)
    osl_q = np.quantile(osl, qs, method="inverted_cdf").astype(float)
    return Traffic(isl_q, osl_q, np.full(QUANTILE_POINTS, 1 / QUANTILE_POINTS), source, arrivals,
                   None if arrivals is None else isl, None if arrivals is None else osl)


def day_traffic(s, path: Path, objective, Traffic, whole_traffic):
    """``(traffic of the whole day, (peak rate,), windows)`` of ``serving`` (a ``ServingIn``).

    ``Traffic`` and ``whole_traffic`` (the trace reader ``_traffic``) come from
    :mod:`optimizer.serving.schema`, which calls this (no import back: no cycle).

    Raises:
        InputError: window_min without a trace, windows with a trace or top-level lengths/rate,
            a window without lengths, shares not adding up to 1, no request in the whole day,
            closed-loop traffic, a maximising objective, more than :data:`MAX_WINDOWS` windows.
    """
    tr = s.traffic
    where = "serving.traffic.windows" if tr.windows is not None else "serving.traffic.window_min"
    if objective.sense == "max":
        raise InputError(path, where, f"a day plan sizes workers for each window's rate: objective {objective.name} "
                                      f"maximises the rate, use gpus (GPU-hours) or dollars")
    if tr.concurrency is not None:
        raise InputError(path, "serving.traffic.concurrency", "a day plan takes open-loop windows, not closed-loop users")
    if tr.length_low_fraction is not None:
        raise InputError(path, "serving.traffic.length_low_fraction", "not supported by a day plan (its windows "
                                                                      "carry their lengths exactly)")
    if s.fixed is not None:
        raise InputError(path, "serving.fixed", "a fixed plan is estimated for steady traffic, not for a day plan")
    if tr.windows is not None:
        if tr.window_min is not None:
            raise InputError(path, "serving.traffic.window_min", "splits a trace; serving.traffic.windows gives each "
                                                                 "window's own length_min")
        for k in ("rate_rps", "isl", "osl", "classes", "trace", "trace_requests"):
            if getattr(tr, k) is not None:
                raise InputError(path, f"serving.traffic.{k}", "serving.traffic.windows carries each window's rate and "
                                                               "lengths: give them per window")
        return _listed(Traffic, tr.windows, path)
    if tr.trace is None:
        raise InputError(path, "serving.traffic.window_min", "splits a trace: give serving.traffic.trace, or list "
                                                             "serving.traffic.windows")
    if tr.rate_rps is not None:
        raise InputError(path, "serving.traffic.rate_rps", "a trace split into windows gives each window's rate "
                                                           "(its requests / window_min)")
    whole, _ = whole_traffic(tr, path)
    return whole, *_split(Traffic, whole, tr.window_min * 60.0, path)


def _listed(Traffic, items, path: Path):
    windows, t = [], 0.0
    for i, wi in enumerate(items):
        f = f"serving.traffic.windows[{i}]"
        if (wi.isl is None) == (wi.classes is None):
            raise InputError(path, f, "give isl/osl or classes for each window")
        if wi.isl is not None:
            if wi.osl is None:
                raise InputError(path, f"{f}.osl", "required field is missing (with isl)")
            traffic = Traffic(np.array([float(wi.isl)]), np.array([float(wi.osl)]), np.array([1.0]),
                              f"isl {wi.isl}, osl {wi.osl}")
        else:
            if wi.osl is not None:
                raise InputError(path, f"{f}.osl", "osl goes with isl (classes carry their own)")
            w = np.array([c.share for c in wi.classes])
            if abs(w.sum() - 1.0) > 1e-6:
                raise InputError(path, f"{f}.classes", f"shares must add up to 1 (got {w.sum():g})")
            traffic = Traffic(np.array([float(c.isl) for c in wi.classes]), np.array([float(c.osl) for c in wi.classes]),
                              w, f"{len(w)} classes")
        windows.append(Window(i, t, wi.length_min * 60.0, float(wi.rate_rps), traffic))
        t += wi.length_min * 60.0
    if len(windows) > MAX_WINDOWS:
        raise InputError(path, "serving.traffic.windows", f"{len(windows)} windows; at most {MAX_WINDOWS}")
    served = [w for w in windows if w.rate > 0]
    if not served:
        raise InputError(path, "serving.traffic.windows", "every window has rate_rps 0: nothing to plan for")
    # the day's mix (length checks, the static view): every window's points weighted by its requests
    req = np.array([w.rate * w.length_s for w in served])
    isl = np.concatenate([w.traffic.isl for w in served])
    osl = np.concatenate([w.traffic.osl for w in served])
    weight = np.concatenate([w.traffic.weight * r for w, r in zip(served, req)]) / req.sum()
    day = Traffic(isl, osl, weight, f"{len(windows)} windows")
    return day, (max(w.rate for w in windows),), tuple(windows)


def _split(Traffic, whole, length_s: float, path: Path):
    """The windows of a trace (see the module docstring)."""
    arr = whole.arrivals
    count = int(math.floor(arr[-1] / length_s)) + 1
    if count > MAX_WINDOWS:
        raise InputError(path, "serving.traffic.window_min", f"splits the trace into {count} windows; at most "
                                                             f"{MAX_WINDOWS} (give a longer window)")
    idx = np.minimum(np.floor(arr / length_s).astype(int), count - 1)
    windows = []
    for k in range(count):
        sel = np.nonzero(idx == k)[0]
        n = len(sel)
        if n == 0:
            traffic = Traffic(whole.isl, whole.osl, whole.weight, "no requests")
        else:
            a = arr[sel] - arr[sel[0]]
            traffic = _mix(Traffic, whole.trace_isl[sel], whole.trace_osl[sel], f"{n} requests of {whole.source}", a)
        # the last window ends with the trace (its rate over the time it covers, not the full length)
        span = length_s if k < count - 1 else min(length_s, max(float(arr[-1]) - k * length_s, 1.0))
        windows.append(Window(k, k * length_s, span, n / span, traffic, n))
    return (max(w.rate for w in windows),), tuple(windows)
