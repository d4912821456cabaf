"""Independent evaluator: a discrete-event simulation (SimPy) of the chosen workers.

Requests arrive as a seeded Poisson process with lengths drawn from the classes (or replay a
trace, its arrival times scaled to the rate asked). Every forward pass takes the pool's step-time
source's time for what it actually carries (:class:`optimizer.model.steptimes.StepTimes`:
``mixed_step_s``, ``prefill_s``; analytic or measured), so queues, batch sizes and chunk shares emerge from
the simulation rather than from the analytic formulas of :mod:`optimizer.serving.perf`.

* Aggregated: arrivals go to the worker with the least ``assigned / r_j`` (smooth weighted
  round robin); a worker runs steps carrying up to ``chunk_tokens`` prompt tokens per rank
  (FIFO, several prompts packed) plus every running decode; admission is capped at its
  ``max_batch`` (prefilling + decoding) and, with :attr:`Problem.kv_admission` ``on_demand``
  (vLLM, SGLang), by the KV cache: a prompt enters when its tokens fit beside the running ones
  (less a 1% watermark), running decodes grow a token per step, and when they overflow the newest
  is preempted and queued first to recompute its prompt and the tokens it had (its first token
  stays where it was). The step's make-up follows :attr:`Problem.scheduler`:
  ``chunked`` (the budget is for prompt tokens alone: the default without an engine named),
  ``mixed`` (vLLM ``max_num_batched_tokens`` and TensorRT-LLM ``max_num_tokens`` count the
  decodes' tokens too, so prompts get ``C·dp - decodes``) or ``prefill_first`` (SGLang's default
  scheduler: a waiting prompt batch runs as a step of its own, the decodes pause). The first token comes at the end of a prompt's last chunk.
* Disaggregated: one FIFO prompt queue for all prefill ranks (one prompt per rank at a time);
  then the KV goes over the prefill worker's link (FIFO, ``α + bytes/(g·B)``, or the layerwise
  excess); the first token counts at arrival on the decode worker (smooth weighted round robin),
  which admits up to ``max_batch`` decodes and runs a step per token.

Speculative decoding (``serving.speculative``): every decode step advances each request by its
own accepted count, drawn with a seeded RNG (``simulation.seed``): ``1 + min(G, k)`` tokens, G
the drafts accepted before the first rejection (geometric with success ``1 - a``, so the mean
is ``(1 - a^(k+1))/(1 - a)``, Leviathan et al. 2023, eq. 1); a request finishes at the step its
drawn counts reach ``OSL - 1``, so TPOT varies between requests as the counts do. The running
KV context grows by the mean count per step. Step times are the source's verify-plus-draft steps.

TPOT of a request = (last token - first token) / (OSL - 1). Arrivals during the warm-up
(:func:`warm_up`) are not counted; requests still unfinished at the end count as missing the SLO.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from optimizer.model.prefill import kv_bytes_per_request, kv_transfer_s
from optimizer.model.steptimes import kv_token_budget
from optimizer.model.prefix import prefill_s as prefix_prefill_s
from optimizer.serving.perf import Worker
from optimizer.serving.schema import Problem, length_bounds


@dataclass
class Req:
    i: int
    arrival: float
    isl: int
    osl: int
    first: float = math.nan
    done: float = math.nan
    left: int = 0  # prompt tokens still to prefill (aggregated)
    cached: int = 0  # prompt tokens served from the prefix cache (serving.traffic.prefix_tokens on a hit)
    on_done: object = None  # closed loop: called when the last token is out (the user sends the next)
    # aggregated: the worker's (prefill s, decode s, steps) totals at arrival, first token and last
    # token (the linearisation a calibration fits on, :attr:`SimResult.linear`)
    c_arr: tuple = ()
    c_first: tuple = ()
    c_done: tuple = ()
    steps: int = 0  # decode steps to its last token (0: OSL - 1, one token per step)
    ptotal: int = 0  # aggregated: tokens its (re)prefill computes (ISL; ISL + decoded after a preemption)
    decoded: int = 0  # decode steps done before a preemption (on-demand KV admission)
    epoch: int = 0  # residencies on a decoder (a preempted request's old heap entry is stale)
    preemptions: int = 0


@dataclass
class SimResult:
    """Simulated figures over the measured requests (s, tokens/s)."""

    requests: int
    completed: int
    ttft_s: dict
    tpot_s: dict
    attainment: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    mean_batch: dict = field(default_factory=dict)  # worker label -> time-average decodes per worker in the window
    e2e_s: dict = field(default_factory=dict)  # end-to-end latency (arrival to last token) p50/p90/p99/mean
    request_rate: float = 0.0  # req/s over the window: closed loop served, open loop offered (end of simulate)
    itl_s: float = math.nan  # mean gap between two output tokens, token-weighted (decode time / decode tokens)
    # aggregated, every measured request finished: mean TTFT and TPOT as [prefill s, decode s, steps,
    # rest s] of the steps inside each request's interval (rest: idle time and the part of the step
    # in flight at arrival), so a = k_pre·[0] + k_dec·[1] + overhead·[2] + [3] to first order
    linear: dict = field(default_factory=dict)
    ttft_attainment: float = math.nan  # share of the measured requests within the TTFT target alone
    tpot_attainment: float = math.nan  # ... within the TPOT target alone (which role a miss asks more of)
    # open loop: {"ttft_s": [4 means], "tpot_s": [...]} over the quarters of the measured requests
    # in arrival order (inf: a request never finished); still rising at the end is a queue growing
    # through the run (:func:`optimizer.serving.estimate.past_capacity_notes`)
    quarters: dict = field(default_factory=dict)
    preemptions: int = 0  # requests preempted (KV cache full, on-demand admission), counted each time
    window_s: float = 0.0  # the measurement window (s): throughput and request rate are over it

    def to_dict(self) -> dict:
        return {"requests": self.requests, "completed": self.completed,
                "ttft_ms": {k: v * 1e3 for k, v in self.ttft_s.items()},
                "tpot_ms": {k: v * 1e3 for k, v in self.tpot_s.items()}, "attainment": self.attainment,
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "tokens_per_s_per_user": self.tokens_per_s_per_user, "mean_batch": self.mean_batch,
                "e2e_ms": {k: v * 1e3 for k, v in self.e2e_s.items()}, "request_rate_rps": self.request_rate,
                "itl_ms": self.itl_s * 1e3, "ttft_attainment": self.ttft_attainment,
                "tpot_attainment": self.tpot_attainment, "quarters": self.quarters, "preemptions": self.preemptions,
                "window_s": self.window_s}


# on-demand KV admission keeps this share of the cache free when it admits a prompt (vLLM's block
# manager watermark, 0.01), so the running decodes grow a while before one is preempted
KV_WATERMARK = 0.01
MAX_REQUESTS = 60_000
REQUESTS_PER_USER = 10  # closed loop: requests per user unless given (benchmarks' num-prompts = 10 x concurrency)


def sim_requests(p: Problem, rate: float) -> int:
    """Requests to simulate at ``rate``: ``simulation.requests``, or more so that the arrivals span
    three request lifetimes (``mean OSL x TPOT target + TTFT target``: one to fill the batches,
    two measured), at most 60,000. A trace is replayed whole (at most 60,000 requests) unless
    ``simulation.requests`` is given."""
    if p.traffic.arrivals is not None and "requests" not in p.simulation.model_fields_set:
        return min(MAX_REQUESTS, len(p.traffic.arrivals))  # the whole trace: its bursts are the point
    life = p.traffic.mean_osl * p.tpot_s + p.ttft_s
    return int(max(p.simulation.requests, min(MAX_REQUESTS, math.ceil(rate * 3 * life))))


def warm_up(p: Problem, reqs: list[Req]) -> int:
    """Requests not counted: those arriving in the first ``min(30% of the arrivals' span, mean OSL x
    TPOT target)`` seconds (the time for the running batch to fill), and at least the first 10%."""
    span = reqs[-1].arrival
    t = min(0.3 * span, p.traffic.mean_osl * p.tpot_s)
    k = next((i for i, r in enumerate(reqs) if r.arrival >= t), len(reqs) - 1)
    return min(max(k, len(reqs) // 10), len(reqs) - 1)


def arrivals(p: Problem, rate: float, n: int, seed: int) -> list[Req]:
    """``n`` requests: the trace (arrivals scaled to ``rate``) or Poisson at ``rate`` with lengths
    drawn from the classes; with prefix reuse each request hits the cache with probability
    ``cache_hit_rate`` (its own seeded stream, so the arrivals are those without reuse)."""
    reqs = _arrivals(p, rate, n, seed)
    if p.prefix is not None:
        hits = np.random.default_rng([seed, 1]).random(len(reqs)) < p.prefix.hit_rate
        own = p.traffic.trace_prefix if p.prefix.per_request else None
        for r, hit in zip(reqs, hits.tolist()):
            if hit:
                r.cached = (int(min(own[r.i], max(r.isl - 1, 0))) if own is not None
                            else int(p.prefix.cached(r.isl)))
    return reqs


def _arrivals(p: Problem, rate: float, n: int, seed: int) -> list[Req]:
    tr = p.traffic
    rng = np.random.default_rng(seed)
    if tr.arrivals is not None:
        k = min(n, len(tr.arrivals))
        t = tr.arrivals[:k]
        own = (len(tr.arrivals) - 1) / max(tr.arrivals[-1], 1e-12)
        t = t * (own / rate)
        return [Req(i, float(t[i]), int(tr.trace_isl[i]), int(tr.trace_osl[i])) for i in range(k)]
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    if tr.spread is not None:  # uniform integer lengths per class (serving.traffic.length_low_fraction)
        c_isl, c_osl, c_w, f = tr.spread
        cls = rng.choice(len(c_w), size=n, p=c_w)
        lo_i, hi_i = np.array([length_bounds(x, f, 1) for x in c_isl]).T
        lo_o, hi_o = np.array([length_bounds(x, f, 2) for x in c_osl]).T
        isl = rng.integers(lo_i[cls], hi_i[cls] + 1).tolist()
        osl = rng.integers(lo_o[cls], hi_o[cls] + 1).tolist()
        return [Req(i, a, isl[i], osl[i]) for i, a in enumerate(t.tolist())]
    cls = rng.choice(len(tr.weight), size=n, p=tr.weight)
    # plain Python numbers first: indexing numpy arrays per request took most of a 200,000-request
    # simulation's set-up, before its first deadline check
    isl, osl = [int(x) for x in tr.isl], [int(x) for x in tr.osl]
    return [Req(i, a, isl[c], osl[c]) for i, (a, c) in enumerate(zip(t.tolist(), cls.tolist()))]


def staggered_gap_s(inst: list, r0: Req, users: int, step_s) -> float:
    """Seconds between two users' first requests under ``start: staggered``: one zero-load request
    time (the first request's prompt alone, then ``OSL - 1`` decode steps with the users spread
    evenly over the decoding workers) over the users, so that the first requests are spread the
    way desynchronised users' requests are in steady state. ``step_s(worker, chunk, c0, batch,
    ctx_sum, ranks)`` is the simulation's step time (s)."""
    dec = [w for w in inst if w.role != "prefill"] or inst
    pre = [w for w in inst if w.role == "prefill"] or dec
    per = max(1, round(users / len(dec)))
    prompt = step_s(pre[0], float(r0.isl), 0.0, 0, 0.0, 1)
    decode = step_s(dec[0], 0.0, 0.0, per, float(per) * (r0.isl + r0.osl / 2), 1)
    return (prompt + (r0.osl - 1) * decode) / users


def draw_speculative_steps(reqs: list[Req], k: int, a: float, seed: int) -> None:
    """Set each request's decode steps under speculative decoding (module docstring): per step
    ``1 + min(G, k)`` tokens with ``G ~ Geometric(1 - a) - 1`` (accepted drafts before the first
    rejection), drawn from ``numpy.random.default_rng([seed, 27])`` (a stream of its own, so the
    arrivals of a seed do not change), until the request's ``OSL - 1`` tokens are out."""
    rng = np.random.default_rng([int(seed), 27])
    mean = (k + 1.0) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
    for r in reqs:
        need = r.osl - 1
        if a >= 1:
            r.steps = max(1, math.ceil(need / (k + 1)))
            continue
        done = steps = 0
        while done < need:
            n = max(8, int(1.2 * (need - done) / mean) + 8)
            x = 1 + np.minimum(rng.geometric(1.0 - a, n) - 1, k)
            cum = done + np.cumsum(x)
            hit = int(np.searchsorted(cum, need))  # first index with cum >= need
            if hit < n:
                steps += hit + 1
                done = need
            else:
                steps += n
                done = int(cum[-1])
        r.steps = steps


class _Router:
    """Smooth weighted round robin: the next request goes to the least ``assigned / weight``."""

    def __init__(self, weights):
        self.w = list(weights)
        self.n = [0] * len(self.w)

    def pick(self) -> int:
        j = min(range(len(self.w)), key=lambda k: (self.n[k] + 1) / self.w[k])
        self.n[j] += 1
        return j


class _Decoder:
    """Running decodes of one worker: finish heap by step index, KV tokens summed."""

    def __init__(self, cum: list | None = None, tokens_per_step: float = 1.0):
        self.cum = cum  # the worker's running (prefill s, decode s, steps) totals, copied at each finish
        self.tau = tokens_per_step  # mean tokens a step adds to each running decode's context
        self.step = 0
        self.heap: list = []
        self.ctx = 0.0  # Σ (position + 1) of running decodes: their KV tokens
        self.n = 0
        self.order: list = []  # (request, epoch, step added, ctx0) in admission order (preemption: newest)

    def add(self, r: Req, steps: int, ctx0: float):
        """Start decoding ``r``: ``steps`` to its last token (its drawn speculative steps instead
        when it has them), ``ctx0`` its KV tokens now; after a preemption, the steps left."""
        steps = (r.steps or steps) - r.decoded
        heapq.heappush(self.heap, (self.step + steps, r.i, r, ctx0, steps, r.epoch))
        self.order.append((r, r.epoch, self.step, ctx0))
        self.ctx += ctx0
        self.n += 1

    def preempt_newest(self) -> Req:
        """Stop the most recently admitted running decode (vLLM's recompute preemption): its KV is
        freed, ``r.decoded`` counts the steps it had done; its heap entry goes stale."""
        while True:
            r, epoch, start, ctx0 = self.order.pop()
            if r.epoch == epoch and math.isnan(r.done):
                break
        done = self.step - start
        self.ctx -= ctx0 + done * self.tau
        self.n -= 1
        r.decoded += done
        r.epoch += 1
        r.preemptions += 1
        return r

    def advance(self, now: float) -> None:
        self.step += 1
        self.ctx += self.n * self.tau
        while self.heap and self.heap[0][0] <= self.step:
            _, _, r, ctx0, steps, epoch = heapq.heappop(self.heap)
            if epoch != r.epoch:  # preempted since: not running here any more
                continue
            r.done = now
            if self.cum is not None:
                r.c_done = tuple(self.cum)
            self.ctx -= ctx0 + steps * self.tau
            self.n -= 1
            if r.on_done is not None:
                r.on_done(r)


class SimulationCut(Exception):
    """The wall-clock deadline passed before the simulation reached its horizon."""


SLICES = 200  # with a wall-clock deadline the simulated time runs in this many slices of the arrivals' span


def simulate(p: Problem, workers: list[Worker], counts: dict[int, int], mode: str, rate: float,
             requests: int | None = None, seed: int | None = None, deadline: float | None = None,
             concurrency: int | None = None) -> SimResult:
    """Simulate the plan ``counts`` ({worker index: n}) at ``rate`` requests/s (see module docstring).

    ``concurrency``: closed loop instead (``rate`` ignored): that many users, each sending its next
    request (lengths drawn as for open loop) when its last one finishes; ``requests`` in all
    (default :data:`REQUESTS_PER_USER` per user), every one counted, the measurement window from
    0 to the last finish.

    ``deadline``: a ``time.perf_counter()`` value; the simulated time then advances in
    ``SLICES`` slices (the same events in the same order) and :class:`SimulationCut` is raised
    when the wall clock passes it between two slices."""
    seed = p.simulation.seed if seed is None else seed
    if concurrency is None:
        n = requests or sim_requests(p, rate)
        reqs = arrivals(p, rate, n, seed)
    else:
        n = max(requests or REQUESTS_PER_USER * concurrency, concurrency)
        reqs = arrivals(p, 1.0, n, seed)  # lengths only; arrivals are set as users send
    if p.speculative is not None:
        draw_speculative_steps(reqs, p.speculative.tokens, p.speculative.acceptance, seed)
    tau = p.tokens_per_step
    env = simpy.Environment()
    cache: dict = {}

    def step_s(w: Worker, chunk: float, c0: float, batch: int, ctx_sum: float, ranks: int) -> float:
        ctx = ctx_sum / batch if batch else 0.0
        key = (id(w), round(chunk / 32), round(c0 / 512), batch, round(ctx / 128), ranks)
        t = cache.get(key)
        if t is None:
            t = p.pools[w.pool].steps.mixed_step_s(w.layout, chunk, c0, batch, ctx, ranks)
            cache[key] = t
        return t

    inst: list[Worker] = [workers[j] for j, c in sorted(counts.items()) for _ in range(c)]
    batches: dict[str, list] = {}  # worker label -> [decode-seconds, seconds] inside the window
    warm = warm_up(p, reqs) if concurrency is None else 0
    win0, win1 = (reqs[warm].arrival, reqs[-1].arrival) if concurrency is None else (0.0, math.inf)

    def record(w: Worker, batch: int, t: float) -> None:
        lo, hi = max(env.now, win0), min(env.now + t, win1)
        if hi > lo:
            acc = batches.setdefault(w.label(p), [0.0, 0.0])
            acc[0] += batch * (hi - lo)
            acc[1] += hi - lo

    if mode == "aggregated":
        router = _Router([w.rate for w in inst])
        queues = [deque() for _ in inst]
        wake = [env.event() for _ in inst]

        cum = [[0.0, 0.0, 0] for _ in inst]

        def worker_proc(k: int, w: Worker):
            dec = _Decoder(cum[k], tau)
            q = queues[k]
            prefilling: list[Req] = []
            C = p.chunk_tokens
            dp = w.layout.attention_dp
            # on-demand KV admission (vLLM, SGLang): a request enters when its prompt's tokens fit
            # the cache beside the running ones; the cache fills as decodes grow and the newest
            # running request is preempted (recomputed later) when it overflows. Reserve: the
            # max batch of mean-length requests (the engine-neutral rule, TensorRT-LLM's)
            on_demand = p.kv_admission == "on_demand"
            # tokens the cache holds, and each request's fixed state (hybrid linear attention) in tokens
            kv_cap, kv_state = kv_token_budget(p.pools[w.pool].steps, w.layout) if on_demand else (math.inf, 0.0)
            alloc = 0.0  # KV tokens of the prompts being prefilled
            while True:
                while q and dec.n + len(prefilling) < w.max_batch:
                    held = dec.ctx + alloc + kv_state * (dec.n + len(prefilling) + 1)
                    if on_demand and (dec.n or prefilling) and held + q[0].ptotal > (1 - KV_WATERMARK) * kv_cap:
                        break  # the next prompt's blocks do not fit (one request alone always enters)
                    prefilling.append(q.popleft())
                    alloc += prefilling[-1].ptotal
                if not prefilling and dec.n == 0:
                    wake[k] = env.event()
                    yield wake[k]
                    continue
                budget = C * dp
                if p.scheduler == "mixed":  # vLLM / TensorRT-LLM: the step's token budget counts the decodes too
                    budget = max(0, C * dp - dec.n)
                taken = []
                for r in prefilling:
                    if budget <= 0:
                        break
                    c = min(r.left, budget)
                    taken.append((r, c))
                    budget -= c
                chunk = sum(c for _, c in taken)
                ranks = min(dp, max(1, math.ceil(chunk / C))) if chunk else 1
                c0 = (taken[0][0].ptotal - taken[0][0].left) if taken else 0
                if p.scheduler == "prefill_first" and chunk:  # SGLang: a prefill batch runs alone, decodes wait
                    t = step_s(w, chunk / ranks, c0, 0, 0.0, ranks)
                    record(w, 0, t)
                    yield env.timeout(t)
                    cum[k][0] += t
                    cum[k][2] += 1
                else:
                    t = step_s(w, chunk / ranks if chunk else 0.0, c0, dec.n, dec.ctx, ranks)
                    record(w, dec.n, t)
                    yield env.timeout(t)
                    t_dec = (step_s(w, 0.0, 0.0, dec.n, dec.ctx, 1) if dec.n else 0.0) if chunk else t
                    cum[k][0] += t - t_dec
                    cum[k][1] += t_dec
                    cum[k][2] += 1
                    dec.advance(env.now)
                for r, c in taken:
                    r.left -= c
                    if r.left <= 0:
                        if math.isnan(r.first):  # a recomputed request's first token came before
                            r.first = env.now
                            r.c_first = tuple(cum[k])
                        prefilling.remove(r)
                        alloc -= r.ptotal
                        dec.add(r, r.osl - 1, r.ptotal + 1)
                while on_demand and dec.n > 1 and dec.ctx + alloc + kv_state * (dec.n + len(prefilling)) > kv_cap:
                    r = dec.preempt_newest()
                    r.ptotal = r.isl + int(round(r.decoded * tau))  # prompt and tokens so far, recomputed
                    r.left = r.ptotal
                    q.appendleft(r)

        def dispatch(r: Req):
            r.ptotal = r.isl
            r.left = r.isl - r.cached  # the chunks start after the cached prefix (c0 = ptotal - left)
            k = router.pick()
            r.c_arr = tuple(cum[k])
            queues[k].append(r)
            if not wake[k].triggered:
                wake[k].succeed()

        for k, w in enumerate(inst):
            env.process(worker_proc(k, w))
    else:
        pre = [w for w in inst if w.role == "prefill"]
        dec_w = [w for w in inst if w.role == "decode"]
        store = simpy.Store(env)
        links = [simpy.Resource(env, capacity=1) for _ in pre]
        router = _Router([w.rate for w in dec_w])
        pending = [deque() for _ in dec_w]
        wake = [env.event() for _ in dec_w]
        pcache: dict = {}

        def prefill_time(w: Worker, isl: int, cached: int) -> float:
            key = (id(w), isl, cached)
            if key not in pcache:
                pcache[key] = prefix_prefill_s(p.pools[w.pool].steps, w.layout, isl, cached)
            return pcache[key]

        def rank_proc(k: int, w: Worker):
            perf = p.pools[w.pool].perf
            while True:
                r = yield store.get()
                t = prefill_time(w, r.isl, r.cached)
                yield env.timeout(t)
                env.process(send(k, w, r, t, perf))

        def send(k, w, r, t_pre, perf):
            with links[k].request() as req:
                yield req
                x = kv_transfer_s(kv_bytes_per_request(perf, r.isl - r.cached), w.gpus, p.kv_link.bandwidth_bytes_per_s,
                                  p.kv_link.alpha_s, t_pre, p.model.layers, p.kv_transfer)
                yield env.timeout(x)
            r.first = env.now
            j = router.pick()
            pending[j].append(r)
            if not wake[j].triggered:
                wake[j].succeed()

        def decode_proc(j: int, w: Worker):
            dec = _Decoder(tokens_per_step=tau)
            while True:
                while pending[j] and dec.n < w.max_batch:
                    r = pending[j].popleft()
                    dec.add(r, r.osl - 1, r.isl + 1)
                if dec.n == 0:
                    wake[j] = env.event()
                    yield wake[j]
                    continue
                t = step_s(w, 0.0, 0.0, dec.n, dec.ctx, 1)
                record(w, dec.n, t)
                yield env.timeout(t)
                dec.advance(env.now)

        def dispatch(r: Req):
            store.put(r)

        for k, w in enumerate(pre):
            for _ in range(w.layout.attention_dp):
                env.process(rank_proc(k, w))
        for j, w in enumerate(dec_w):
            env.process(decode_proc(j, w))

    if concurrency is None:
        def source():
            for r in reqs:
                yield env.timeout(max(0.0, r.arrival - env.now))
                dispatch(r)

        env.process(source())
        horizon = reqs[-1].arrival * 3 + 600.0
        unfinished = None
    else:
        # closed loop: N users each send their next request when the last one finishes (``vllm bench
        # serve --max-concurrency N``); all N start at time 0 (``start: staggered``: spread over one
        # zero-load request time), every request is counted
        pending_reqs = deque(reqs[concurrency:])
        unfinished = [len(reqs)]

        def next_of(_done: Req) -> None:
            unfinished[0] -= 1
            if pending_reqs:
                r = pending_reqs.popleft()
                r.arrival = env.now
                dispatch(r)

        for r in reqs:
            r.on_done = next_of
        if p.start == "staggered":
            gap = staggered_gap_s(inst, reqs[0], concurrency, step_s)

            def starter():
                for i, r in enumerate(reqs[:concurrency]):
                    yield env.timeout(max(0.0, i * gap - env.now))
                    r.arrival = env.now
                    dispatch(r)

            env.process(starter())
        else:
            for r in reqs[:concurrency]:
                r.arrival = 0.0
                dispatch(r)
        horizon = math.inf
    if deadline is None:
        env.run(until=None if math.isinf(horizon) else horizon)
    else:
        step = max(reqs[-1].arrival / SLICES, 1e-3) if concurrency is None else 1.0
        # a closed loop has no horizon: it ends with its last request (each sliced run leaves its
        # own stop event behind, so the event queue never empties by itself)
        while env.peek() < horizon and (unfinished is None or unfinished[0] > 0):
            if time.perf_counter() > deadline:
                raise SimulationCut(f"simulated {env.now:.1f} s of {reqs[-1].arrival:.1f} s of arrivals"
                                    if unfinished is None else
                                    f"simulated {env.now:.1f} s, {len(reqs) - unfinished[0]} of {len(reqs)} "
                                    f"requests of the closed loop finished")
            env.run(until=min(horizon, max(env.now + step, env.peek() + 1e-9)))
    measured = reqs[warm:]
    ttft = np.array([r.first - r.arrival if not math.isnan(r.first) else math.inf for r in measured])
    tpot = np.array([(r.done - r.first) / (r.osl - 1) if not math.isnan(r.done) else math.inf for r in measured])
    ttft_ok, tpot_ok = ttft <= p.ttft_s + 1e-12, tpot <= p.tpot_s + 1e-12
    ok = ttft_ok & tpot_ok
    done = [r for r in measured if not math.isnan(r.done)]
    # throughput over the measurement window (first measured arrival .. last arrival), each
    # request's decode tokens spread evenly between its first and last token
    t0, t1 = measured[0].arrival, reqs[-1].arrival
    if concurrency is not None:
        t1 = max((r.done for r in reqs if not math.isnan(r.done)), default=t0)
        if p.start == "staggered":  # the window opens once every user has sent its first request
            t0 = reqs[min(concurrency, len(reqs)) - 1].arrival
    # requests per second. Closed loop (served): each request counts with the share of its life
    # inside the window (all of it for a start together; a staggered start's early requests only
    # partly, as their tokens). Open loop (offered): the measured arrivals over the window; what
    # was served shows in the tokens, and a queue growing through the run in quarters
    finished = sum(max(0.0, min(r.done, t1) - max(r.arrival, t0)) / max(r.done - r.arrival, 1e-12) for r in done)
    tokens = 0.0
    for r in reqs:
        if math.isnan(r.first):
            continue
        if t0 <= r.first <= t1:
            tokens += 1
        end = r.done if not math.isnan(r.done) else horizon
        span = end - r.first
        if span > 0:
            tokens += (r.osl - 1) * max(0.0, min(end, t1) - max(r.first, t0)) / span
    gpus = sum(w.gpus for w in inst)
    finite = np.isfinite(tpot)

    def pct(a):
        with np.errstate(invalid="ignore"):  # unfinished requests are inf: a percentile between two is nan
            return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
                    "p99": float(np.percentile(a, 99)), "mean": float(np.mean(a))}

    tps = tokens / max(t1 - t0, 1e-9)
    mean_batch = {}
    for label, (area, span) in batches.items():
        mean_batch[label] = area / max(span, 1e-12)
    linear = {}
    lin = [r for r in done if r.c_arr and r.c_first and r.c_done]
    if lin and len(lin) == len(done):
        def parts(a, b, span):
            d = np.array(b) - np.array(a)
            return [float(d[0]), float(d[1]), float(d[2]), float(span - d[0] - d[1])]

        tt = np.array([parts(r.c_arr, r.c_first, r.first - r.arrival) for r in lin])
        tp = np.array([parts(r.c_first, r.c_done, r.done - r.first) for r in lin]) / \
            np.array([[r.osl - 1] for r in lin], dtype=float)
        linear = {"ttft_s": tt.mean(axis=0).tolist(), "tpot_s": tp.mean(axis=0).tolist()}
    e2e = np.array([r.done - r.arrival if not math.isnan(r.done) else math.inf for r in measured])
    q = len(ttft) // 4  # open loop: mean TTFT and TPOT of each quarter of the measured requests by arrival
    quarters = {name: [float(np.mean(a[k * q:(k + 1) * q])) for k in range(4)]
                for name, a in (("ttft_s", ttft), ("tpot_s", tpot))} if concurrency is None and q else {}
    dec_tokens = sum(r.osl - 1 for r in done)
    itl = sum(r.done - r.first for r in done) / dec_tokens if dec_tokens else math.inf
    return SimResult(len(measured), len(done), pct(ttft), pct(tpot), float(ok.mean()), tps, tps / max(gpus, 1),
                     float(1.0 / np.mean(tpot[finite])) if finite.any() else 0.0, mean_batch, pct(e2e),
                     (finished if concurrency is not None else max(len(measured) - 1, 0)) / max(t1 - t0, 1e-9),
                     float(itl), linear, float(ttft_ok.mean()),
                     float(tpot_ok.mean()), quarters, sum(r.preemptions for r in reqs), float(t1 - t0))
