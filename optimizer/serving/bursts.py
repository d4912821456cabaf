"""Bursty arrivals: how much capacity a trace's own arrival process asks for, and bursty traces to test with.

* :func:`fluid_margin` replays a trace through one pooled FIFO server (Lindley's recursion,
  ``W_{i+1} = max(0, W_i + S_i - (a_{i+1} - a_i))``, Kleinrock, *Queueing Systems* vol. 1, eq.
  8.3) whose service of request i is ``S_i = (isl_i / mean ISL) / mu`` seconds, and finds the least
  drain rate ``mu`` (mean prompts per second) whose q-quantile wait is within the TTFT target.
  One pooled server of the same total rate waits no longer than several slower ones (it is work
  conserving over all of them), so ``mu / R`` is where the serving plan's capacity search starts
  (:func:`optimizer.serving.plan_mode`); the simulation of the trace decides whether a plan passes.
* :func:`poisson_bursts` draws bursts at Poisson instants, every burst ``size`` requests arriving
  together (the issue's synthetic test), and :func:`compress_bursts` squeezes each period of a
  trace into its first share (``t -> floor(t/P)·P + (t mod P)·share``): the same requests and
  mean rate, every period's arrivals in ``share·P`` seconds.
"""
from __future__ import annotations

import math

import numpy as np


def lindley_waits(arrivals_s: np.ndarray, service_s: np.ndarray) -> np.ndarray:
    """Wait (s) of every request in one FIFO server (Lindley's recursion, closed form
    ``W_n = S_n - min_{k<=n} S_k`` with ``S_n = sum_{i<n} (service_i - gap_i)``).

    Args:
        arrivals_s: shape (n,), sorted arrival times, s.
        service_s: shape (n,), service times, s.
    """
    x = service_s[:-1] - np.diff(arrivals_s)
    s = np.concatenate(([0.0], np.cumsum(x)))
    return s - np.minimum.accumulate(np.minimum(s, 0.0))


def fluid_margin(arrivals_s: np.ndarray, isl: np.ndarray, rate: float, wait_s: float, q: float,
                 max_margin: float = 1e4) -> float:
    """The least factor ``m >= 1`` such that a pooled server draining ``m·rate`` mean prompts per
    second keeps the q-quantile Lindley wait of the trace within ``wait_s`` (module docstring).

    Args:
        arrivals_s: shape (n,), the trace's arrival times at the rate asked, s.
        isl: shape (n,), prompt tokens per request (the work of each request, relative to the mean).
        rate: the rate asked, req/s (> 0).
        wait_s: the wait allowed, s (the TTFT target).
        q: quantile in (0, 1].
        max_margin: the largest factor searched.

    Returns:
        ``m`` within 1 % (1.0 when the trace at ``rate`` already passes).
    """
    work = np.asarray(isl, dtype=float)
    work = work / max(float(work.mean()), 1e-12)
    t = np.asarray(arrivals_s, dtype=float)

    def ok(m: float) -> bool:
        return float(np.quantile(lindley_waits(t, work / (m * rate)), q)) <= wait_s

    if ok(1.0):
        return 1.0
    lo, hi = 1.0, 2.0
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > max_margin:
            return max_margin
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def poisson_bursts(burst_rate: float, size: int, duration_s: float, seed: int = 1,
                   spread_s: float = 0.0) -> np.ndarray:
    """Arrival times (s) of bursts at Poisson instants of ``burst_rate`` per second over
    ``duration_s``, ``size`` requests each, spread evenly over ``spread_s`` (0: all at once).

    Returns:
        shape (bursts·size,), sorted.
    """
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1.0 / burst_rate, int(burst_rate * duration_s * 2) + 10))
    starts = starts[starts < duration_s]
    offsets = np.linspace(0.0, spread_s, size, endpoint=False) if spread_s > 0 else np.zeros(size)
    return np.sort((starts[:, None] + offsets[None, :]).ravel())


def compress_bursts(arrivals_s: np.ndarray, period_s: float, share: float) -> np.ndarray:
    """Every ``period_s`` of a trace squeezed into its first ``share`` (0 < share <= 1):
    ``t -> floor(t/P)·P + (t mod P)·share``. Order, count and mean rate are kept.

    Returns:
        shape (n,), sorted like the input.
    """
    t = np.asarray(arrivals_s, dtype=float)
    return np.floor(t / period_s) * period_s + np.mod(t, period_s) * share


def scv(arrivals_s: np.ndarray) -> float:
    """Squared coefficient of variation of the inter-arrival times (1 for Poisson)."""
    gaps = np.diff(np.asarray(arrivals_s, dtype=float))
    m = float(gaps.mean())
    return float(gaps.var()) / m ** 2 if m > 0 else math.inf
