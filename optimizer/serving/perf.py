"""Analytic serving model: each worker configuration's largest request rate that meets the SLOs.

A worker configuration is a GPU pool x layout (pp = 1, single server) x role (``prefill``,
``decode``, ``aggregated``). Step times and KV capacity come from the pool's step-time source
(:class:`optimizer.model.steptimes.StepTimes`: the analytic roofline, eq. 6-2 and 6-1, or the
measured kernel database, ``performance.source``). Every SLO is checked at the quantile
``q = max(percentile, 1 - (1 - attainment)/2)`` (:attr:`Problem.quantile`).

Queueing assumptions (stated in the README):

* Aggregated prompts wait in an M/G/c queue per worker (Poisson arrivals split evenly over the
  workers, ``c`` = attention-DP ranks, one prompt per rank at a time); the wait quantile is the
  Allen-Cunneen approximation of Erlang C: ``P(W > t) = C(c, a)·exp(-(cμ - λ)·t·2/(1 + cs²))``
  with ``a = λ·E[S]`` and ``cs²`` the squared coefficient of variation of the service time.
* Disaggregated prompts wait in one queue for all the prefill ranks (the router hands a prompt to
  the first free rank, as the simulator does): ``n`` workers of one configuration are one
  M/G/(n·c) queue, which carries more than ``n`` times one worker's rate (pooling). The MILP
  takes that per configuration (:attr:`Worker.pooling`, :mod:`constraints.serving.pooling`);
  prefill workers of different configurations are taken as separate queues (a lower capacity
  than the one shared queue they are).
* Disaggregated: TTFT = wait + prefill of the quantile prompt + KV transfer (``request`` or
  ``layerwise``, :func:`~optimizer.model.prefill.kv_transfer_s`) over the prefill worker's ``g``
  NICs + the wait for that link (M/G/1, same formula); the link must carry ``λ·E[KV bytes]``.
* Decode: concurrent decodes follow Little's law, ``B = λ·(OSL - 1)·TPOT``; a request sees itself
  plus the others, whose count is Poisson (M/G/inf), so TPOT is checked at the step time with
  ``1 + B + z_q·sqrt(B)`` decodes; that many must fit the KV memory and ``max_batch``.
* Speculative decoding (``serving.speculative``, :mod:`optimizer.model.speculative`): a step
  emits ``E = (1 - a^(k+1))/(1 - a)`` tokens per request on average (Leviathan et al. 2023, eq. 1),
  so ``TPOT = step / E`` and a request needs ``(OSL - 1)/E`` steps; the step (verify plus draft
  passes) and the memory come from the pool's step-time source. Without it ``E = 1``.
* Aggregated (continuous batching with chunked prefill, ``chunk_tokens`` C per rank): a share
  ``f = λ·E[ISL]·t̄/(C·dp)`` of the steps carries a chunk; the mean step ``t̄ = f·t_mix + (1-f)·t_dec``
  is the mean TPOT (chunks included); the TPOT quantile adds to the decode step with ``B_q`` decodes
  the chunks of the q-quantile (Poisson) number of prompts arriving during the request's decode;
  the prompt queue is served at ``C`` tokens per ``t_mix``; TTFT = wait + the prompt's chunks,
  each a mixed step with the running decodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from optimizer.model.layout import Layout, enumerate_layouts, spanning_layouts
from optimizer.model.measured import LayoutNotTimed
from optimizer.model.prefill import kv_bytes_per_request, kv_transfer_s
from optimizer.model.prefix import no_reuse, prefill_s as prefix_prefill_s, weighted_quantile
from optimizer.serving.schema import Pool, Problem

ROLES = ("aggregated", "prefill", "decode")
LIMITS = {
    "ttft": "TTFT target (queue wait + prefill)",
    "tpot": "TPOT target (decode step with the batch)",
    "kv_memory": "KV-cache memory per GPU",
    "kv_link": "KV transfer link between prefill and decode",
    "max_batch": "serving.max_batch (max-num-seqs)",
    "weights": "weights do not fit the GPU memory",
    "prefill_capacity": "chunk budget cannot keep up with the prompts",
    "not_timed": "the measured database cannot time this layout",
}


@dataclass
class Worker:
    """One worker configuration and its analytic figures.

    Attributes:
        role: ``prefill``, ``decode`` or ``aggregated``.
        pool: index into :attr:`Problem.pools`.
        layout: its layout; gpus: GPUs per worker.
        max_batch: decodes it admits (``--max-num-seqs``), or prompts in flight for prefill.
        rate: largest request rate per worker meeting the SLOs, requests/s (0: none).
        limit: what caps ``rate`` (a key of :data:`LIMITS`); detail: one sentence with numbers.
        zero_load: figures at a rate near zero (ttft_s / tpot_s / prefill_s / transfer_s).
        pooling: prefill only: ``((n_k, r_k), ...)``, breakpoints ``n_1 = 1 < n_2 < ...`` and the
            per-worker rate (req/s) ``n_k`` workers of this configuration sustain sharing one prompt
            queue (``r_1 = rate``, non-decreasing); empty: no pooling gain (``rate`` per worker).
    """

    role: str
    pool: int
    layout: Layout
    gpus: int
    max_batch: int
    rate: float = 0.0
    limit: str = ""
    detail: str = ""
    zero_load: dict = field(default_factory=dict)
    pooling: tuple = ()

    def label(self, p: Problem) -> str:
        return f"{self.role} {self.layout.label()} on {p.pools[self.pool].name}"

    def per_worker_rate(self, n: int) -> float:
        """Requests/s each of ``n`` workers of this configuration carries within the SLOs: the
        pooled rate of the largest breakpoint ``n_k <= n`` (:attr:`pooling`; a lower bound between
        breakpoints, since the pooled rate per worker does not fall as ``n`` grows), else ``rate``."""
        r = self.rate
        for nk, rk in self.pooling:
            if nk > n:
                break
            r = rk
        return r

    def capacity(self, n: int) -> float:
        """Requests/s ``n`` workers of this configuration carry within the SLOs (``n·per_worker_rate(n)``)."""
        return n * self.per_worker_rate(n) if n > 0 else 0.0


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with offered load ``a = λ·E[S] < c``
    (Erlang C, computed from the Erlang B recursion ``B_k = a·B_{k-1}/(k + a·B_{k-1})``)."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1 - b))


def wait_quantile_s(lam: float, mean_s: float, scv: float, c: int, q: float) -> float:
    """Quantile ``q`` of the queue wait (s) of an M/G/c queue (Allen-Cunneen form of Erlang C, see
    the module docstring); ``inf`` when ``λ·E[S] >= c``."""
    if lam <= 0:
        return 0.0
    a = lam * mean_s
    if a >= c:
        return math.inf
    cw = erlang_c(c, a)
    if cw <= 1 - q:
        return 0.0
    return math.log(cw / (1 - q)) * (1 + scv) / (2 * (c / mean_s - lam))


def poisson_quantile(m: float, q: float) -> int:
    """Smallest k with P(N <= k) >= q for N ~ Poisson(m) (summed term by term; 0 for m = 0)."""
    if m <= 0:
        return 0
    term = cdf = math.exp(-m) if m < 700 else 0.0
    if term == 0.0:  # far in the normal regime
        return int(math.ceil(m + NormalDist().inv_cdf(q) * math.sqrt(m)))
    k = 0
    while cdf < q:
        k += 1
        term *= m / k
        cdf += term
    return k


def _bisect_max(ok, hi: float, iters: int = 40) -> float:
    """Largest x in (0, hi) with ok(x), assuming ok is monotone (True then False); 0 if none."""
    lo = 0.0
    if not ok(hi * 1e-9):
        return 0.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


class ServingModel:
    """Figures of every worker configuration of one problem (cached step times)."""

    def __init__(self, p: Problem):
        self.p = p
        self.z = NormalDist().inv_cdf(p.quantile)
        tr = p.traffic
        self.isl_q = tr.isl_quantile(p.quantile)
        self.mean_isl = tr.mean_isl
        self.mean_osl = tr.mean_osl
        self.tokens_per_step = p.tokens_per_step  # E: 1 without speculative decoding
        self.decode_tokens = self.mean_osl - 1.0  # tokens after the first, per request
        self.decode_steps = self.decode_tokens / self.tokens_per_step  # decode steps per request
        # a decode token at position s reads s+1 tokens; positions isl .. isl+osl-2
        self.decode_ctx = self.mean_isl + self.mean_osl / 2.0
        # the prompts as computed: (new tokens, cached tokens, weight) points (optimizer/model/prefix.py)
        pts = p.prefix.points(tr.isl, tr.weight) if p.prefix is not None else no_reuse(tr.isl, tr.weight)
        self.pre_new, self.pre_cached, self.pre_w = pts
        self.mean_new = float(np.dot(self.pre_new, self.pre_w))
        self.mean_cached = float(np.dot(self.pre_cached, self.pre_w))
        self.scv_new = float(np.dot(self.pre_w, (self.pre_new - self.mean_new) ** 2)) / self.mean_new ** 2
        qi = int(np.argmin(np.abs(self.pre_new - weighted_quantile(self.pre_new, self.pre_w, p.quantile))))
        self.new_q, self.cached_q = float(self.pre_new[qi]), float(self.pre_cached[qi])
        # this model's own caches (a cache on the class would keep every model of the process alive)
        self._prefill_s = lru_cache(maxsize=None)(self._prefill_s_uncached)
        self._table = lru_cache(maxsize=None)(self._table_uncached)
        self._pparts: dict = {}

    def retarget(self, ttft_s: float | None = None, tpot_s: float | None = None) -> "ServingModel":
        """The same model at other TTFT/TPOT targets (s), keeping the step-time and prefill caches
        (they depend on the model, hardware, traffic and efficiencies, not on the targets): the warm
        start of a sweep over targets (:mod:`optimizer.serving.pareto`). Modifies and returns ``self``.

        Raises:
            ValueError: a target that is not a positive number of seconds.
        """
        from dataclasses import replace

        changes = {}
        for name, v in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
            if v is not None:
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                    raise ValueError(f"{name} must be a positive number of seconds (got {v!r})")
                changes[name] = float(v)
        if changes:
            self.p = replace(self.p, **changes)
        return self

    # ------------------------------------------------------------------ configurations
    def layouts(self, pool: Pool, role: str) -> list[Layout]:
        """pp = 1 layouts on one server that the engines launch: dense TP (DP attention only for
        MoE); MoE experts either follow attention TP (EP 1) or spread over every GPU (EP = TP x DP).
        ``serving.<role>.tp`` / ``max_gpus`` restrict them; a ``max_gpus`` above the server's GPUs
        adds, for MoE models, the wide-EP layouts over 2 or more whole servers up to it
        (:func:`optimizer.model.layout.spanning_layouts`: attention TP inside a server x DP, EP over
        all the worker's GPUs), so the optimiser chooses the span. Prefill workers also get each of those
        layouts with every CP degree of ``serving.prefill.cp`` that still fits the server
        (``cp x GPUs``; chapter 6.2.4), after the ``cp = 1`` ones. ``serving.<role>.sp: true``
        runs the role's layouts with attention TP > 1 with sequence parallelism instead (chapter
        6.2.3: ``TP8 SP``; TP1 layouts stay as they are)."""
        from dataclasses import replace

        role_in = self.p.roles[role]
        per_server = pool.hw.server.gpus
        max_g = min(role_in.max_gpus or per_server, per_server)
        base = self._base_layouts(role_in, max_g)
        if role_in.max_gpus and role_in.max_gpus > per_server:  # wide EP over whole servers (opt-in)
            base += [lay for lay in spanning_layouts(self.p.model, per_server, min(role_in.max_gpus, pool.count))
                     if role_in.tp is None or lay.attention_tp in role_in.tp]
        if getattr(role_in, "sp", False):
            base = [replace(lay, sp=True) if lay.attention_tp > 1 else lay for lay in base]
        cps = [c for c in (getattr(role_in, "cp", None) or [1]) if c > 1] if role == "prefill" else []
        if not cps:
            return base
        keep = base if 1 in (role_in.cp or [1]) else []
        return keep + [replace(lay, cp=c) for c in sorted(cps) for lay in base if lay.gpus * c <= max_g]

    def _base_layouts(self, role_in, max_g: int) -> list[Layout]:
        out = []
        m = self.p.model
        for lay in enumerate_layouts(m, max_g):
            if lay.pp != 1:
                continue
            if m.moe is None and lay.attention_dp != 1:
                continue
            if m.moe is not None and not ((lay.experts_ep == 1 and lay.attention_dp == 1)
                                          or (lay.experts_tp == 1 and lay.experts_ep == lay.gpus and lay.gpus > 1)):
                continue
            if role_in.tp is not None and lay.attention_tp not in role_in.tp:
                continue
            out.append(lay)
        return out

    def workers(self, roles=ROLES) -> list[Worker]:
        """Every configuration of the given roles with its largest rate (``rate = 0`` with the reason when it cannot serve).

        Under ``performance.source: measured`` a layout the database cannot time gets limit
        ``not_timed`` (the estimator's reason) and no rate, as the engines cannot run it either.

        Raises:
            LayoutNotTimed: the database can time none of the layouts (the first one's reason).
        """
        out, untimed = [], []
        for i, pool in enumerate(self.p.pools):
            for role in roles:
                for lay in self.layouts(pool, role):
                    w = Worker(role, i, lay, lay.gpus, 0)
                    try:
                        {"prefill": self._prefill, "decode": self._decode, "aggregated": self._aggregated}[role](w)
                    except LayoutNotTimed as exc:
                        w.rate, w.limit, w.detail, w.zero_load = 0.0, "not_timed", exc.problem, {}
                        untimed.append(exc)
                    out.append(w)
        if untimed and len(untimed) == len(out):
            raise untimed[0]
        return out

    def size(self, w: Worker) -> Worker:
        """``w`` with its largest rate at the SLO (``rate``, ``limit``, ``detail``), as
        :meth:`workers` sizes every configuration; the rate the simulation's router weights it by.

        Raises:
            LayoutNotTimed: the measured database cannot time ``w``'s layout.
        """
        {"prefill": self._prefill, "decode": self._decode, "aggregated": self._aggregated}[w.role](w)
        return w

    # ------------------------------------------------------------------ step-time helpers
    def _perf(self, w: Worker):
        return self.p.pools[w.pool].perf

    def _prefill_s_uncached(self, pool: int, lay: Layout, n: float, cached: float = 0.0) -> float:
        return prefix_prefill_s(self.p.pools[pool].steps, lay, int(n), cached)

    def _table_uncached(self, pool: int, lay: Layout, chunk: float, c0: float, ranks: int) -> tuple[np.ndarray, np.ndarray]:
        """Step time over a grid of decode batch sizes: every integer to 16, then 64 geometric points (about 10%
        apart) to well past the memory cap; between grid points the time is interpolated linearly."""
        steps = self.p.pools[pool].steps
        top = 8.0 * max(steps.max_sessions(lay, int(math.ceil(self.mean_isl)), int(math.ceil(self.mean_osl))), 64)
        grid = np.unique(np.concatenate([np.arange(0, 17, dtype=float), np.geomspace(16, top, 64)]))
        t = np.array([steps.mixed_step_s(lay, chunk, c0, float(b), self.decode_ctx, ranks) for b in grid])
        return grid, t

    def _step(self, pool: int, lay: Layout, chunk: float, c0: float, batch: float, ranks: int) -> float:
        grid, t = self._table(pool, lay, float(chunk), float(c0), int(ranks))
        if batch > grid[-1]:
            return self.p.pools[pool].steps.mixed_step_s(lay, chunk, c0, batch, self.decode_ctx, ranks)
        return float(np.interp(batch, grid, t))

    def decode_step_s(self, w: Worker, batch: float) -> float:
        """Decode step (s) with ``batch`` running decodes at the mean context."""
        return self._step(w.pool, w.layout, 0.0, 0.0, float(batch), 1)

    def decode_tpot_s(self, w: Worker, batch: float) -> float:
        """TPOT (s) of a decode step with ``batch`` running decodes: the step over the tokens it
        emits per request (``E``, 1 without speculative decoding)."""
        return self.decode_step_s(w, batch) / self.tokens_per_step

    def batch_cap(self, w: Worker) -> int:
        """Decodes that fit: memory (eq. 6-1, every request at its full mean length) and max_batch."""
        mem = self.p.pools[w.pool].steps.max_sessions(w.layout, int(math.ceil(self.mean_isl)), int(math.ceil(self.mean_osl)))
        return min(mem, self.p.max_batch)

    # ------------------------------------------------------------------ prefill
    def transfer_s(self, w: Worker, isl: float, prefill: float) -> float:
        p = self.p
        kvb = kv_bytes_per_request(self._perf(w), int(isl))
        return kv_transfer_s(kvb, w.gpus, p.kv_link.bandwidth_bytes_per_s, p.kv_link.alpha_s, prefill,
                             p.model.layers, p.kv_transfer)

    def _prefill_parts(self, w: Worker) -> tuple[float, float, float, float, float, float]:
        """The rate-free parts of a prefill worker's TTFT: mean and SCV of the prefill time (s),
        mean and SCV of the KV transfer time (s), the quantile prompt's prefill and transfer (s)."""
        key = (w.pool, w.layout, w.gpus)
        got = self._pparts.get(key)
        if got is None:
            p, pw = self.p, self.pre_w
            s = np.array([self._prefill_s(w.pool, w.layout, float(n + k), float(k))
                          for n, k in zip(self.pre_new, self.pre_cached)])
            mean_s = float(np.dot(pw, s))
            scv_s = float(np.dot(pw, (s - mean_s) ** 2)) / mean_s ** 2
            link_bw = w.gpus * p.kv_link.bandwidth_bytes_per_s
            # a cached prefix is on the decode workers too: only the new tokens' KV goes over the link
            tx = np.array([kv_bytes_per_request(self._perf(w), int(n)) for n in self.pre_new]) / link_bw
            mean_tx = float(np.dot(pw, tx))
            scv_tx = float(np.dot(pw, (tx - mean_tx) ** 2)) / mean_tx ** 2 if mean_tx > 0 else 0.0
            sq = weighted_quantile(s, pw, p.quantile)
            got = self._pparts[key] = (mean_s, scv_s, mean_tx, scv_tx, sq, self.transfer_s(w, self.new_q, sq))
        return got

    def prefill_figures(self, w: Worker, lam: float, n: int = 1) -> dict:
        """TTFT quantile (s) and its parts for a prefill worker at ``lam`` requests/s, one of ``n``
        workers of its configuration sharing one prompt queue (M/G/(n·c) at ``n·lam``; each
        worker's own KV link at ``lam``)."""
        mean_s, scv_s, mean_tx, scv_tx, sq, xq = self._prefill_parts(w)
        c = w.layout.attention_dp
        q = self.p.quantile
        wq = wait_quantile_s(n * lam, mean_s, scv_s, n * c, q)
        wl = wait_quantile_s(lam, mean_tx, scv_tx, 1, q)
        return {"ttft_s": wq + sq + xq + wl, "wait_s": wq, "prefill_s": sq, "transfer_s": xq, "link_wait_s": wl,
                "utilisation": lam * mean_s / c, "link_utilisation": lam * mean_tx, "mean_prefill_s": mean_s,
                "mean_transfer_s": mean_tx}

    def _pooling(self, w: Worker, hi: float) -> tuple:
        """:attr:`Worker.pooling` of a prefill configuration whose one-worker rate is ``w.rate``:
        breakpoints 1, 2, 3, 4 and then about 1.5 times the last (6, 9, 13, 19, ...) up to the pool's worker count, ending once the rate
        per worker is within 0.5 % of ``hi`` (the rate at which a worker is busy all the time)."""
        top = self.p.pools[w.pool].count // w.gpus
        out = [(1, w.rate)]
        n, r = 1, w.rate
        while r < 0.995 * hi:
            n = n + 1 if n < 4 else n + n // 2
            if n > top:
                break
            # the pooled rate per worker does not fall with n: bisect above the last one
            lo, top_r = r, hi
            for _ in range(24):
                mid = (lo + top_r) / 2
                if self.prefill_figures(w, mid, n)["ttft_s"] <= self.p.ttft_s:
                    lo = mid
                else:
                    top_r = mid
            r = lo
            if r > out[-1][1] * (1 + 1e-6):
                out.append((n, r))
        return tuple(out) if len(out) > 1 else ()

    def _prefill(self, w: Worker) -> None:
        p = self.p
        perf = self._perf(w)
        w.max_batch = w.layout.attention_dp
        if perf.static_bytes_per_gpu(w.layout) + perf.kv_bytes_per_gpu(w.layout, int(self.isl_q), 0) > perf.hw.gpu.memory_bytes:
            w.limit, w.detail = "weights", "weights and one prompt's KV do not fit the GPU memory"
            return
        z = self.prefill_figures(w, 0.0)
        w.zero_load = z
        if z["ttft_s"] > p.ttft_s:
            without_link = z["prefill_s"] + p.kv_link.alpha_s
            if without_link <= p.ttft_s:
                w.limit = "kv_link"
                w.detail = (f"prefill {z['prefill_s'] * 1e3:.0f} ms + KV transfer {z['transfer_s'] * 1e3:.0f} ms "
                            f"({kv_bytes_per_request(perf, int(self.new_q)) / 1e9:.2f} GB over {w.gpus} x "
                            f"{p.kv_link.bandwidth_bytes_per_s / 1e9:g} GB/s) > TTFT {p.ttft_s * 1e3:g} ms")
            else:
                w.limit = "ttft"
                w.detail = f"prefill alone {z['prefill_s'] * 1e3:.0f} ms > TTFT {p.ttft_s * 1e3:g} ms"
            return
        hi = min(w.layout.attention_dp / z["mean_prefill_s"], 1.0 / z["mean_transfer_s"] if z["mean_transfer_s"] else math.inf)
        w.rate = _bisect_max(lambda lam: self.prefill_figures(w, lam)["ttft_s"] <= p.ttft_s, hi)
        if w.rate > 0:
            w.pooling = self._pooling(w, hi)
        f = self.prefill_figures(w, w.rate)
        w.limit = "kv_link" if f["link_utilisation"] > f["utilisation"] else "ttft"
        w.detail = self.prefill_detail(w, 1)

    def prefill_detail(self, w: Worker, n: int) -> str:
        """The sentence of a prefill configuration's limit at its rate per worker when ``n`` of
        its workers share the prompt queue (:meth:`Worker.per_worker_rate`)."""
        r = w.per_worker_rate(n)
        f = self.prefill_figures(w, r, n)
        shared = f", {n} workers sharing one queue" if n > 1 and r > w.rate else ""
        return (f"at {r:.3g} req/s{shared}: wait {f['wait_s'] * 1e3:.0f} ms + prefill {f['prefill_s'] * 1e3:.0f} ms + "
                f"transfer {(f['transfer_s'] + f['link_wait_s']) * 1e3:.0f} ms = TTFT {f['ttft_s'] * 1e3:.0f} ms "
                f"(prefill busy {f['utilisation']:.0%}, link busy {f['link_utilisation']:.0%})")

    # ------------------------------------------------------------------ decode
    def decode_batch(self, w: Worker, lam: float) -> float:
        """Mean concurrent decodes B with ``B = λ·(OSL-1)·t(1 + B)`` (Little's law), by bisection
        (the right side grows slower than B below saturation); inf when unstable."""
        k = lam * self.decode_steps
        if k <= 0:
            return 0.0
        cap = 4.0 * max(self.batch_cap(w), 1)
        if k * self.decode_step_s(w, 1 + cap) >= cap:
            return math.inf
        lo, hi = 0.0, cap
        for _ in range(40):
            mid = (lo + hi) / 2
            if k * self.decode_step_s(w, 1 + mid) > mid:
                lo = mid
            else:
                hi = mid
        return hi

    def decode_figures(self, w: Worker, lam: float) -> dict:
        b = self.decode_batch(w, lam)
        if not math.isfinite(b):
            return {"batch": b, "batch_q": b, "tpot_s": math.inf, "mean_tpot_s": math.inf}
        bq = 1 + b + self.z * math.sqrt(b)
        return {"batch": b, "batch_q": bq, "tpot_s": self.decode_tpot_s(w, bq), "mean_tpot_s": self.decode_tpot_s(w, 1 + b),
                "tokens_per_s": lam * self.decode_tokens}

    def _decode(self, w: Worker) -> None:
        p = self.p
        cap = self.batch_cap(w)
        w.max_batch = cap
        if cap < 1:
            w.limit, w.detail = ("weights" if self._perf(w).static_bytes_per_gpu(w.layout) > self._perf(w).hw.gpu.memory_bytes
                                 else "kv_memory"), "not even one request's KV fits next to the weights"
            return
        t1 = self.decode_tpot_s(w, 1)
        w.zero_load = {"tpot_s": t1}
        per = "" if self.tokens_per_step == 1 else f" per {self.tokens_per_step:.3g} tokens"
        if t1 > p.tpot_s:
            w.limit, w.detail = "tpot", f"batch-1 step{per} {t1 * 1e3:.2f} ms > TPOT {p.tpot_s * 1e3:g} ms"
            return

        def ok_b(b):
            bq = 1 + b + self.z * math.sqrt(b)
            return bq <= cap and self.decode_tpot_s(w, bq) <= p.tpot_s

        b = _bisect_max(ok_b, float(cap))
        w.rate = b / (self.decode_steps * self.decode_step_s(w, 1 + b))
        bq = 1 + b + self.z * math.sqrt(b)
        if self.decode_tpot_s(w, min(cap, bq + 1)) <= p.tpot_s:
            w.limit = "max_batch" if cap == p.max_batch else "kv_memory"
        else:
            w.limit = "tpot"
        w.detail = (f"{b:.1f} decodes on average ({bq:.1f} at the {p.quantile:.0%} quantile, cap {cap}): "
                    f"step{per} {self.decode_tpot_s(w, bq) * 1e3:.2f} ms vs TPOT {p.tpot_s * 1e3:g} ms")

    # ------------------------------------------------------------------ aggregated
    def _chunks(self, n: float, start: float = 0.0) -> list[tuple[float, float]]:
        """``(chunk tokens, context before)`` of a prompt's ``n`` computed tokens after ``start`` cached ones."""
        c = self.p.chunk_tokens
        out, done = [], 0.0
        while done < n:
            k = min(c, n - done)
            out.append((k, start + done))
            done += k
        return out

    def aggregated_figures(self, w: Worker, lam: float) -> dict:
        """Mean and quantile TPOT, TTFT quantile and the chunk share of an aggregated worker at ``lam``."""
        p = self.p
        dp = w.layout.attention_dp
        C = float(p.chunk_tokens)
        # the mean context before a chunk: the cached prefix, then half the rest before the last chunk
        c0 = max(0.0, self.mean_cached + (self.mean_new - C) / 2.0)
        kp = lam * self.mean_new / (C * dp)
        bad = {"ttft_s": math.inf, "tpot_s": math.inf, "mean_tpot_s": math.inf, "batch": math.inf, "batch_q": math.inf,
               "chunk_share": math.inf}

        def tbar(b):
            td = self._step(w.pool, w.layout, 0.0, 0.0, b, 1)
            tm = self._step(w.pool, w.layout, C, c0, b, dp)
            den = 1 - kp * (tm - td)
            if den <= 0:
                return math.inf, math.inf, tm
            t = td / den
            return t, kp * t, tm

        b = 0.0
        for _ in range(60):
            t, f, _tm = tbar(1 + b)
            if not math.isfinite(t) or f >= 1:
                return bad
            nb = lam * self.decode_steps * t
            if nb > 4 * max(w.max_batch, 1):
                return bad
            if abs(nb - b) < 1e-6 * max(1.0, b):
                b = nb
                break
            b = nb
        bq = 1 + b + self.z * math.sqrt(b)
        tq, fq, tmq = tbar(bq)
        t_mean, f_mean, tm = tbar(1 + b)
        if not math.isfinite(tq) or fq >= 1:
            return bad
        # TPOT quantile: the decode step with B_q decodes plus the chunks of the prompts that arrive
        # during the request's own decode (Poisson with mean m = λ·steps·t̄, steps = (OSL-1)/E, its
        # q-quantile), each adding E[ISL]/(C·dp) mixed steps of extra (t_mix - t_dec), spread over
        # its OSL-1 tokens; a step emits E tokens (speculative decoding), so step times divide by E
        e = self.tokens_per_step
        td_q = self._step(w.pool, w.layout, 0.0, 0.0, bq, 1)
        m = lam * self.decode_steps * t_mean
        extra = poisson_quantile(m, p.quantile) * self.mean_new / (C * dp) * (tmq - td_q) / self.decode_tokens
        tq = max(tq / e, td_q / e + extra)
        t_mean = t_mean / e
        mean_s = self.mean_new / C * tm
        wq = wait_quantile_s(lam, mean_s, self.scv_new, dp, p.quantile)
        prefill = sum(self._step(w.pool, w.layout, k, c_before, b, dp)
                      for k, c_before in self._chunks(self.new_q, self.cached_q))
        return {"ttft_s": wq + prefill, "wait_s": wq, "prefill_s": prefill, "tpot_s": tq, "mean_tpot_s": t_mean,
                "batch": b, "batch_q": bq, "chunk_share": f_mean, "tokens_per_s": lam * self.decode_tokens}

    def _aggregated(self, w: Worker) -> None:
        p = self.p
        cap = self.batch_cap(w)
        w.max_batch = cap
        if cap < 1:
            w.limit, w.detail = "kv_memory", "not even one request's KV fits next to the weights"
            return
        z = self.aggregated_figures(w, 0.0)
        w.zero_load = z
        if z["tpot_s"] > p.tpot_s:
            w.limit, w.detail = "tpot", f"batch-1 step {z['tpot_s'] * 1e3:.2f} ms > TPOT {p.tpot_s * 1e3:g} ms"
            return
        if z["ttft_s"] > p.ttft_s:
            w.limit, w.detail = "ttft", f"chunked prefill alone {z['ttft_s'] * 1e3:.0f} ms > TTFT {p.ttft_s * 1e3:g} ms"
            return

        def ok(lam):
            f = self.aggregated_figures(w, lam)
            return f["ttft_s"] <= p.ttft_s and f["tpot_s"] <= p.tpot_s and f["batch_q"] + w.layout.attention_dp <= cap

        hi = cap / (self.decode_steps * self.decode_step_s(w, 1))
        w.rate = _bisect_max(ok, hi, iters=30)
        f = self.aggregated_figures(w, w.rate * 1.02)
        if f["batch_q"] + w.layout.attention_dp > cap:
            w.limit = "max_batch" if cap == p.max_batch else "kv_memory"
        elif f["chunk_share"] >= 1:
            w.limit = "prefill_capacity"
        elif f["ttft_s"] > p.ttft_s and not f["tpot_s"] > p.tpot_s:
            w.limit = "ttft"
        else:
            w.limit = "tpot"
        g = self.aggregated_figures(w, w.rate)
        w.detail = (f"at {w.rate:.3g} req/s: {g['batch']:.1f} decodes, chunks in {g['chunk_share']:.0%} of steps, "
                    f"TPOT {g['tpot_s'] * 1e3:.2f} ms, TTFT {g['ttft_s'] * 1e3:.0f} ms")
