"""``optimize estimate INSTANCE.yaml``: the figures of a fixed plan (``serving.fixed``), no optimising.

The workers of ``serving.fixed.workers`` (role, count, layout, max batch, pool) are built by the
same :class:`~optimizer.serving.perf.ServingModel` the optimiser uses and simulated by the same
evaluator (:func:`optimizer.serving.simulate.simulate`), so an estimate of a configuration equals
the optimiser's simulated figures for those workers. Traffic is closed loop
(``traffic.concurrency``: N users, each sending its next request when the last finishes, as
``vllm bench serve --max-concurrency``) or open loop (``rate_rps``, Poisson, one estimate per rate).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from optimizer.errors import InputError
from optimizer.model.layout import Layout, layout_problem, span_problem
from optimizer.model.measured import LayoutNotTimed
from optimizer.serving.perf import ServingModel, Worker
from optimizer.serving.schema import Problem
from optimizer.serving.simulate import SimResult, SimulationCut, simulate


DEFINITIONS = {
    "plan.estimates[]": "one simulation of serving.fixed per traffic point (a concurrency or a rate)",
    "plan.estimates[].traffic": "closed loop: concurrency (users); open loop: rate_rps (Poisson)",
    "plan.estimates[].workers[]": "the fixed workers: layout label, count, GPUs each, max batch",
    "plan.estimates[].figures.ttft_ms": "time to first token, ms (mean, p50, p90, p99 over completed requests)",
    "plan.estimates[].figures.tpot_ms": "time per output token after the first, ms (mean, p50, p90, p99)",
    "plan.estimates[].figures.itl_ms": "mean inter-token latency, ms",
    "plan.estimates[].figures.e2e_ms": "request end-to-end latency, ms (mean, p50, p90, p99)",
    "plan.estimates[].figures.attainment": "share of completed requests meeting both the TTFT and TPOT targets",
    "plan.estimates[].figures.tokens_per_s_per_gpu": "output tokens/s over the simulated span per GPU of the plan",
    "plan.estimates[].figures.tokens_per_s_per_user": "output tokens/s of one request while it decodes (1 / TPOT)",
    "plan.estimates[].figures.requests": "requests measured (an open loop's warm-up excluded)",
    "plan.estimates[].figures.completed": "measured requests that finished before the simulation ended",
    "plan.estimates[].figures.request_rate_rps": "requests per second in the measurement window: closed loop, served "
                                                 "(each request by the share of its life inside the window); open loop, "
                                                 "offered (the measured Poisson arrivals over the window, n - 1 gaps)",
    "plan.estimates[].figures.quarters": "open loop: mean TTFT and TPOT (s) of each quarter of the measured requests "
                                         "in arrival order; rising to the end is a queue growing (see notes)",
    "plan.estimates[].figures.tokens_per_s": "output tokens/s over the measurement window, all workers",
    "plan.estimates[].figures.window_s": "the measurement window, s: closed loop, from the start (staggered: the last "
                                         "user's start) to the last finish; open loop, from the first measured "
                                         "arrival to the last arrival",
    "plan.estimates[].figures.mean_batch": "per worker configuration: time-average running decodes per worker in "
                                           "the window",
    "plan.estimates[].figures.ttft_attainment": "share of the measured requests within the TTFT target alone",
    "plan.estimates[].figures.tpot_attainment": "share of the measured requests within the TPOT target alone",
    "plan.estimates[].figures.preemptions": "requests preempted because the KV cache filled (vLLM/SGLang on-demand "
                                            "admission; each recomputed later), counted each time",
    "plan.estimates[].notes": "what the figures mean when the point is past capacity (TTFT or TPOT still rising "
                              "through the run), too short to tell, or requests were left unfinished",
    "plan.estimates[].timing": "per pool: the step-time source (analytic or measured) and its stated error band",
    "solver.time_s": "wall time of the simulations, seconds (no search runs)",
}


@dataclass(frozen=True)
class Estimate:
    """The simulated figures of one fixed plan under one traffic (a rate or a concurrency)."""

    problem: Problem
    workers: tuple[Worker, ...]
    counts: dict
    mode: str
    traffic: dict
    sim: SimResult
    time_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        p = self.problem
        gpus = sum(self.workers[j].gpus * c for j, c in self.counts.items())
        return {"problem": "serving-estimate", "name": p.name, "status": "estimated", "time_s": self.time_s,
                "timing": p.timing, "traffic": self.traffic, "mode": self.mode, "gpus": gpus,
                "workers": [{"label": self.workers[j].label(p), "count": c, "gpus": self.workers[j].gpus,
                             "max_batch": self.workers[j].max_batch} for j, c in self.counts.items()],
                "figures": self.sim.to_dict(), "notes": list(self.notes)}


def fixed_workers(p: Problem) -> tuple[list[Worker], dict[int, int], str]:
    """The workers of ``serving.fixed`` as the optimiser's :class:`Worker` objects, their counts and
    the mode (``aggregated`` or ``disaggregated``).

    Raises:
        InputError: no ``serving.fixed``; a pool that is not in the instance; a layout the model
            cannot take; prefill without decode workers (or the reverse) or aggregated mixed with them;
            a max batch above what the KV cache holds; workers needing more GPUs than a pool has.
    """
    if p.fixed is None:
        raise InputError(p.path, "serving.fixed", "required field is missing (optimize estimate evaluates a fixed "
                                                  "plan: serving.fixed.workers)")
    model = ServingModel(p)
    names = [pl.name for pl in p.pools]
    workers, counts = [], {}
    for i, f in enumerate(p.fixed.workers):
        where = f"serving.fixed.workers[{i}]"
        if f.pool is None and len(names) > 1:  # no default pool: which GPUs a worker runs on is the plan
            raise InputError(p.path, f"{where}.pool", f"required with more than one pool (the instance has "
                                                      f"{', '.join(names)})")
        pool = 0 if f.pool is None else (names.index(f.pool) if f.pool in names else -1)
        if pool < 0:
            raise InputError(p.path, f"{where}.pool", f"no pool {f.pool!r} (the instance has {', '.join(names)})")
        moe = p.model.moe is not None
        ep = f.ep if f.ep is not None else 1
        lay = Layout(attention_tp=f.tp, attention_dp=f.dp, experts_tp=(f.tp * f.dp) // ep if moe else f.tp,
                     experts_ep=ep if moe else 1, cp=f.cp, sp=f.sp)
        if f.cp > 1 and f.role != "prefill":
            raise InputError(p.path, f"{where}.cp", "context parallelism is modelled for prefill workers only")
        bad = layout_problem(p.model, lay)
        if bad is not None:
            raise InputError(p.path, f"{where}.{'sp' if bad[0] == 'sp' else 'tp'}", bad[1])
        span = span_problem(lay, p.pools[pool].hw.server.gpus)
        if span is not None:
            raise InputError(p.path, f"{where}.{span[0] if span[0] == 'tp' else 'dp'}",
                             f"{span[1]} (on {p.pools[pool].server})")
        w = Worker(f.role, pool, lay, lay.gpus, 0, rate=1.0)
        if f.role == "prefill":
            w.max_batch = lay.attention_dp
        else:
            cap = model.batch_cap(w)
            if cap < 1:
                raise InputError(p.path, where, f"{lay.label()} on {p.pools[pool].name}: not even one request's KV "
                                                f"fits next to the weights")
            if p.kv_admission == "on_demand" and f.role == "aggregated":  # (decode workers: reserve, below)
                # the engine admits a request when its prompt fits and preempts as the cache fills:
                # max_batch is only its --max-num-seqs; unset, as many as the prompts fit
                prompts = p.pools[pool].steps.max_sessions(lay, int(math.ceil(model.mean_isl)), 0)
                w.max_batch = f.max_batch or max(cap, min(prompts, p.max_batch))
            else:
                if f.max_batch is not None and f.max_batch > cap:
                    raise InputError(p.path, f"{where}.max_batch", f"{f.max_batch} requests of the mean length do "
                                                                   f"not fit the KV cache of {lay.label()} (at most {cap})")
                w.max_batch = f.max_batch or cap
        counts[len(workers)] = f.count
        workers.append(w)
    for k, pl in enumerate(p.pools):  # the plan must fit the GPUs the instance has
        used = sum(workers[j].gpus * c for j, c in counts.items() if workers[j].pool == k)
        if used > pl.count:
            raise InputError(p.path, "serving.fixed.workers", f"the workers on {pl.name} need {used} GPUs, more than "
                                                              f"the {pl.count} the instance has")
    roles = {w.role for w in workers}
    if "aggregated" in roles and roles != {"aggregated"}:
        raise InputError(p.path, "serving.fixed.workers", "aggregated workers do not mix with prefill/decode workers")
    if roles & {"prefill", "decode"} and roles != {"prefill", "decode"}:
        missing = ({"prefill", "decode"} - roles).pop()
        raise InputError(p.path, "serving.fixed.workers", f"a disaggregated plan needs {missing} workers too")
    if p.homogeneous:
        for role in sorted(roles):
            kinds = {(w.pool, w.layout.label()) for w in workers if w.role == role}
            if len(kinds) > 1:
                raise InputError(p.path, "serving.homogeneous", f"the fixed plan's {role} workers use "
                                                                f"{len(kinds)} configurations (homogeneous: one per role)")
    for role in roles:  # the router weighs each worker by its rate at the SLO, as in the optimiser's plans
        mine = [w for w in workers if w.role == role]
        if len({(w.pool, w.layout) for w in mine}) < 2:
            continue  # one configuration: equal weights, no sizing needed
        for w in mine:
            cap = w.max_batch
            try:
                model.size(w)
            except LayoutNotTimed as exc:
                raise InputError(p.path, "serving.fixed.workers", exc.problem) from None
            w.max_batch = cap  # the fixed plan's own
        if any(w.rate <= 0 for w in mine):  # one cannot meet the SLO at all: no rate to weigh, all the same
            for w in mine:
                w.rate = 1.0
    return workers, counts, ("aggregated" if roles == {"aggregated"} else "disaggregated")


def warn_ignored(raw: dict, path) -> None:
    """Warn (:func:`optimizer.errors.warn_input`) about fields of a serving instance that
    ``optimize estimate`` reads but does not use: the optimiser's ``serving.mode`` (the fixed plan's
    roles are the mode), ``simulation.enabled: false`` (an estimate is a simulation) and, under a
    closed loop, ``simulation.requests`` (10 requests per user unless ``--requests``)."""
    from optimizer.errors import warn_input

    sv = raw.get("serving") if isinstance(raw.get("serving"), dict) else {}
    sim = sv.get("simulation") if isinstance(sv.get("simulation"), dict) else {}
    traffic = sv.get("traffic") if isinstance(sv.get("traffic"), dict) else {}
    if "mode" in sv:
        warn_input(path, "serving.mode", "ignored by optimize estimate: the fixed plan's workers give the mode")
    if sim.get("enabled") is False:
        warn_input(path, "serving.simulation.enabled", "ignored by optimize estimate: an estimate is a simulation")
    if "requests" in sim and traffic.get("concurrency") is not None:
        warn_input(path, "serving.simulation.requests", "ignored in a closed loop: 10 requests per user unless "
                                                        "--requests gives the total")


class EstimateCut(Exception):
    """``--time-limit`` ran out during a simulation: the points finished before it (``done``) and
    where the cut one stood (``message``)."""

    def __init__(self, done: list, point: str, message: str):
        super().__init__(message)
        self.done, self.point, self.message = done, point, message


def estimate(p: Problem, requests: Optional[int] = None, deadline: Optional[float] = None) -> list[Estimate]:
    """One :class:`Estimate` per traffic point: the concurrency, or each rate of ``rate_rps``.

    ``deadline``: a ``time.perf_counter()`` value after which a running simulation stops.

    Raises:
        InputError: as :func:`fixed_workers`; ``requests`` fewer than the closed loop's users
            (each user sends at least one).
        EstimateCut: the deadline passed inside a simulation (its figures would describe part
            of the run, so none are given for that point).
    """
    workers, counts, mode = fixed_workers(p)
    if requests is not None and p.concurrency is not None and requests < p.concurrency:
        raise InputError("--requests", "", f"{requests} requests for {p.concurrency} users: each user sends at least "
                                           f"one (give at least {p.concurrency}, or lower serving.traffic.concurrency)")
    out = []
    points = [("concurrency", p.concurrency)] if p.concurrency is not None else [("rate_rps", r) for r in p.rates]
    for kind, v in points:
        t0 = time.perf_counter()
        try:
            if kind == "concurrency":
                sim = simulate(p, workers, counts, mode, 1.0, requests=requests, concurrency=int(v), deadline=deadline)
            else:
                sim = simulate(p, workers, counts, mode, float(v), requests=requests, deadline=deadline)
        except SimulationCut as exc:
            raise EstimateCut(out, f"c={v}" if kind == "concurrency" else f"{v:g} req/s", str(exc)) from None
        out.append(Estimate(p, tuple(workers), counts, mode, {kind: v, "source": p.traffic.source}, sim,
                            time.perf_counter() - t0, past_capacity_notes(kind, v, sim, p.ttft_s + p.traffic.mean_osl * p.tpot_s)))
    return out


GROWTH = 1.25  # a quarter's mean TTFT or TPOT this many times the second quarter's: still rising
MIN_MEASURED = 40  # fewer measured requests than this: no verdict on capacity
STEADY_LIVES = 2  # a window shorter than this many request lifetimes at the SLO may still be filling up


def past_capacity_notes(kind: str, value: float, sim: SimResult, life_s: float = 0.0) -> tuple[str, ...]:
    """What an open-loop point's figures mean when the workers do not keep up with it.

    Past capacity, a queue grows through the run: waiting prompts (TTFT) or a decode batch that
    keeps growing (TPOT, as engines admit more requests). The test is on the measured requests in
    arrival order (:attr:`SimResult.quarters`): the mean TTFT or TPOT of the third and fourth
    quarters rising above the second's, the fourth at least :data:`GROWTH` times it. A stable
    queue's quarters fluctuate around one level (within +-40% on the examples tested). A
    served-over-offered rate was not used: over a run as short as a few request lifetimes it is
    below the offered rate for a stable plan too. For the same reason a rise within a window
    shorter than :data:`STEADY_LIVES` request lifetimes at the SLO (``life_s``: TTFT + mean OSL x
    TPOT targets, the lifetime the default run length is sized on) may be the plan still filling
    up, and the note says both. Also noted: requests unfinished at the end, and runs too short
    (:data:`MIN_MEASURED`) for a verdict."""
    notes = []
    if kind == "rate_rps":
        if sim.requests < MIN_MEASURED or not sim.quarters:
            notes.append(f"{sim.requests} measured request(s): too few to tell whether {float(value):g} req/s is within the "
                         f"workers' capacity (give --requests for at least {MIN_MEASURED} after the warm-up)")
        else:
            rising = []
            if math.isinf(sim.quarters["tpot_s"][3]):  # the last arrivals never finished
                rising.append("the last quarter of the arrivals left unfinished")
            else:
                for name, fmt, label in (("ttft_s", lambda x: f"{x:.2f} s", "TTFT"),
                                         ("tpot_s", lambda x: f"{x * 1e3:.1f} ms", "TPOT")):
                    q = sim.quarters[name]
                    if q[3] >= GROWTH * q[1] and q[3] > q[2] > q[1]:
                        rising.append(f"mean {label} {' -> '.join(fmt(x) for x in q)} over the quarters of the arrivals")
            if rising and sim.window_s < STEADY_LIVES * life_s:
                notes.append(f"latency still rising at the end of the run ({'; '.join(rising)}): past capacity, or a "
                             f"run too short to reach a steady state (the measurement window, {sim.window_s:.3g} s, is "
                             f"under {STEADY_LIVES} request lifetimes at the SLO, {life_s:.3g} s each): raise --requests "
                             f"to tell")
            elif rising:
                notes.append(f"past capacity: {float(value):g} req/s is more than these workers serve, the queue grows "
                             f"through the run ({'; '.join(rising)}), so latencies "
                             f"grow with the run's length (--requests) and describe no steady state")
    if sim.preemptions:
        notes.append(f"{sim.preemptions} preemptions: the KV cache filled as decodes grew and the engine's on-demand "
                     f"admission stopped the newest requests to recompute them later")
    if sim.completed < sim.requests:
        notes.append(f"{sim.requests - sim.completed} of {sim.requests} requests unfinished when the simulation "
                     f"ended (counted as missing the SLO)")
    return tuple(notes)


def render(estimates: list[Estimate], console) -> None:
    """Rich table of the estimates."""
    from rich.markup import escape
    from rich.table import Table

    p = estimates[0].problem
    console.print(f"[bold]{escape(p.name)}[/bold]  serving estimate (fixed plan, simulated)")
    for name, t in p.timing.items():
        console.print(escape(f"timed by: {t['why']} ({name})"))
    e0 = estimates[0]
    console.print(escape("workers: " + ", ".join(f"{c}x {e0.workers[j].label(p)} (max batch {e0.workers[j].max_batch})"
                                                for j, c in e0.counts.items())))
    t = Table(title=f"Simulated figures ({p.traffic.source}; on time: TTFT <= {p.ttft_s * 1e3:g} ms and TPOT <= "
                    f"{p.tpot_s * 1e3:g} ms)")
    for col in ("traffic", "req/s", "TTFT ms mean|p50|p90|p99", "TPOT ms mean|p50|p90|p99", "ITL ms", "E2E ms mean|p90",
                "tok/s/GPU", "tok/s/user", "on time"):
        t.add_column(col)

    def ms(x: float, digits: int = 1) -> str:  # unfinished requests leave no finite figure
        return f"{x * 1e3:.{digits}f}" if math.isfinite(x) else "-"

    def point(e: Estimate) -> str:
        return f"c={e.traffic['concurrency']}" if "concurrency" in e.traffic else f"{e.traffic['rate_rps']:g} req/s"

    for e in estimates:
        s = e.sim
        f = lambda d: " | ".join(ms(d[k]) for k in ("mean", "p50", "p90", "p99"))  # noqa: E731
        t.add_row(point(e), f"{s.request_rate:.3g}", f(s.ttft_s), f(s.tpot_s), ms(s.itl_s, 2),
                  f"{ms(s.e2e_s['mean'], 0)} | {ms(s.e2e_s['p90'], 0)}", f"{s.tokens_per_s_per_gpu:.1f}",
                  f"{s.tokens_per_s_per_user:.1f}", f"{s.attainment:.0%}")
    console.print(t)
    for e in estimates:
        for n in e.notes:
            console.print(escape(f"{point(e)}: {n}"))
