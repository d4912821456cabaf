"""The parameter layer of the deployment problem: every constant the formulations, bounds and
heuristics read, built once per solve from the one performance model.

A *kind* is a replica layout (TP/PP/EP/attention-DP and its batch limit); a *class* is a set of
sessions with equal (context, new tokens, deadline). :class:`Kind` holds the per-(kind, class)
arrays (single-session service time, KV bytes per GPU and stage, time shares), computed from
the performance model's public :class:`~optimizer.model.perf.StageStep`
(:meth:`~optimizer.model.perf.PerfModel.stage_step`); :class:`LpParams` is the fluid bound LP's
view of the same constants (the real classes, or a relaxed instance with fewer classes).
:class:`Params` bundles them for one solve. Nothing here solves anything; nothing else calls
the model's private methods.

Units: seconds, bytes, tokens; arrays are numpy float64 indexed [kind][class] or [stage, class].
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Optional

import numpy as np

from optimizer.deployment.schema import Problem, SessionClass
from optimizer.deployment.units import ticks_up
from optimizer.model.layout import Layout, layout_problem

LP_MAX_CLASSES = 400  # beyond this the bound LP is built on a relaxed (rounded-down) instance
SIGMA_MAX_BATCH = 1024  # σ of a kind is evaluated at every batch size up to this (~25 ms; 0 beyond: still a valid bound)


# ---------------------------------------------------------------------------- instance kinds
@dataclass
class Kind:
    """One instance type (layout) with per-class constants (arrays over problem.classes).

    Attributes:
        layout: the layout; gpus: its GPUs; batch_cap: most sessions decoded at once.
        tp_plain: a plain TP layout in a one-at-a-time problem (plan instances carry no layout).
        alone: single-session service time (s) per class.
        static: static bytes per GPU per pipeline stage; kv: KV bytes per GPU [stage, class]
            (the fullest DP rank holds at most all of them; the LP uses the average over ranks).
        fits: per class, one session fits an instance alone.
        work: per class, a lower bound of the instance time the session uses (s): ``alone``
            one at a time, else its KV-read time; w_step: weight-read time of one step (s).
        sigma: seconds each session in a step adds to it besides its KV reads, a lower bound
            valid for every batch size (:func:`session_step_floor`; 0 for DP attention).
    """

    layout: Layout
    gpus: int
    batch_cap: int
    tp_plain: bool
    alone: np.ndarray
    static: np.ndarray
    kv: np.ndarray
    fits: np.ndarray
    work: np.ndarray
    w_step: float
    est: Optional[np.ndarray] = None  # work plus each step's growth of collectives and compute with one more token (heuristics only)
    sigma: float = 0.0


def kv_and_weight_rates(perf, lay: Layout) -> tuple[float, float]:
    """(fixed seconds per step, KV-read seconds per token position) of ``lay``: every step with a
    session takes at least the first plus the second times the token positions its sessions read
    (KV averaged over the attention-DP ranks), from the instance's step-time source
    (:meth:`optimizer.model.decode_steps.DecodeSteps.fixed_and_kv_rates`; the roofline's weight
    read plus one token's collectives, eq. 6-2, or the floor of the measured tables)."""
    return perf.steps.fixed_and_kv_rates(lay, perf.max_positions)


def session_step_floor(perf, lay: Layout, w: float, b_max: int) -> float:
    """σ (s): the largest rate with ``step(b) ≥ w + KV reads + σ·(b − 1)`` for every batch size
    1 ≤ b ≤ ``b_max`` (:meth:`optimizer.model.decode_steps.DecodeSteps.session_step_floor`).
    Over a run, ``Σ_steps σ·(b − 1) = σ·(session-steps − steps)``, which the configuration LP
    adds as ``σ·new`` per session and ``−σ`` per step. 0 for attention DP, for b_max < 2 and
    under two micro-batches."""
    return perf.steps.session_step_floor(lay, w, b_max, perf.max_positions)


def token_rate(perf, lay: Layout, tokens: int = 16) -> float:
    """Seconds one more decoding session adds to a step of ``lay`` besides its KV reads: an
    estimate for the constructive and LNS surrogates (the LP bound does not use it)."""
    return perf.steps.token_rate(lay, tokens)


def degree_fits_hardware(problem: Problem, p: int) -> Optional[str]:
    """None if TP-``p`` instances can be placed on the hardware, else the reason."""
    g, s = problem.server.gpus, problem.servers
    if p > g * s:
        return f"tp{p} needs {p} GPUs > {g * s} available"
    if p > g and p % g:
        return f"tp{p} spans servers but is not a multiple of {g} GPUs per server"
    return None


def degree_fits_model(problem: Problem, p: int) -> Optional[str]:
    """None if a TP-``p`` group can split the model's heads (as vLLM and SGLang require:
    p divides the attention heads, and p divides the KV heads or is a multiple of them)."""
    m = problem.model
    if m.q_heads % p or (m.kv_heads % p and p % m.kv_heads):
        return f"{m.q_heads} attention heads and {m.kv_heads} KV heads do not split evenly over TP{p}"
    return None


def usable_degrees(problem: Problem, perf, degrees) -> list[int]:
    """The TP degrees of ``degrees`` whose replicas fit the hardware and the heads and hold at
    least one session of some class."""
    out = []
    for p in degrees:
        if degree_fits_hardware(problem, p) is not None or degree_fits_model(problem, p) is not None:
            continue
        if all(perf.max_sessions(p, c.context, c.new) == 0 for c in problem.classes):
            continue
        out.append(p)
    return out


def layout_reason(problem: Problem, lay: Layout) -> Optional[tuple[str, str]]:
    """None if instances of ``lay`` can be placed, else (rule, detail)."""
    bad = layout_problem(problem.model, lay)
    if bad:
        return "heads", f"{lay.label()}: {bad[1]}"
    g, total = problem.server.gpus, problem.total_gpus
    if lay.gpus > total:
        return "gpus", f"{lay.label()} needs {lay.gpus} GPUs > {total} available"
    if (lay.gpus <= g and g % lay.gpus) or (lay.gpus > g and lay.gpus % g):
        return "gpus", (f"{lay.label()} uses {lay.gpus} GPUs, which neither divides nor is a multiple of the "
                        f"{g} GPUs of a server (the batched search packs instances exactly only then)")
    return None


def instance_kinds(problem: Problem, perf, layouts) -> list[Kind]:
    """Constants of every placeable layout (see :class:`Kind`)."""
    m = perf.model
    classes = problem.classes
    ctx = np.array([c.context for c in classes], dtype=np.float64)
    new = np.array([c.new for c in classes], dtype=np.float64)
    out = []
    for lay in layouts:
        if layout_reason(problem, lay) is not None:
            continue
        alone = np.array([float(perf.steps.single_session_step_s(lay, np.arange(c.context, c.context + c.new)).sum())
                          for c in classes])
        static, kv = m.stage_memory_terms(lay, [(c.context, c.new) for c in classes])
        fits = np.all(static[:, None] + kv <= problem.gpu.memory_bytes * (1 - 1e-9), axis=0)
        if not fits.any():
            continue
        cap = problem.batch_cap
        w, kv_rate = kv_and_weight_rates(perf, lay)
        # Σ_{s=ctx}^{ctx+new-1} (s+1) token positions read over the session's steps
        positions = new * ctx + new * (new + 1) / 2
        work = alone if cap == 1 else kv_rate * positions
        est = work if cap == 1 else work + new * token_rate(perf, lay)
        # every session of an instance stays resident, so no step holds more than fit in memory
        least = np.min(kv[:, fits], axis=1)  # [stage]
        resident = np.min(np.where(least > 0, np.floor((problem.gpu.memory_bytes - static) / np.where(least > 0, least, 1.0)),
                                   np.inf))
        b_max = int(min(cap, resident))
        sigma = session_step_floor(perf, lay, w, b_max) if cap > 1 and b_max <= SIGMA_MAX_BATCH else 0.0
        out.append(Kind(lay, lay.gpus, cap, problem.tp_only, alone, static, kv, fits, work, w, est, sigma))
    return out


@dataclass
class Inst:
    kind: int
    sessions: list[int]  # indices into problem.sessions
    order: list[int] = field(default_factory=list)  # admission order (session indices)
    batch: int = 1
    finish: Optional[np.ndarray] = None  # finish times (s) in admission order

    @property
    def makespan(self) -> float:
        return float(self.finish.max()) if self.finish is not None and len(self.finish) else 0.0



class LpKind(NamedTuple):
    """A kind as the fluid bound LP sees it (arrays over the LP's classes C, stages S).

    Attributes:
        gpus: GPUs of one replica; alone: single-session service time (s) [C];
        work: a session's share of a replica's time (s) [C] and w_step: the fixed time of a step
            (s), both from :func:`step_split`; room: bytes per GPU left for KV [S];
        kv: KV bytes per GPU, averaged over the attention-DP ranks [S, C];
        min_new: fewest new tokens of any class; dp: attention-DP ranks;
        one_at_a_time: the kind decodes one session at a time.
    """

    gpus: int
    alone: np.ndarray
    work: np.ndarray
    w_step: float
    room: np.ndarray
    kv: np.ndarray
    min_new: float
    dp: int
    one_at_a_time: bool


@dataclass
class LpParams:
    """Per-class constants of the fluid bound LP (the real classes, or a relaxed instance's).

    Attributes:
        count: sessions per class [C]; dl: deadline per class (s, inf: none) [C]; new: new
            tokens per class [C]; kinds: one :class:`LpKind` per kind; cmap: the LP class of every
            problem class [problem classes].
    """

    count: np.ndarray
    dl: np.ndarray
    new: np.ndarray
    kinds: list
    cmap: np.ndarray


def step_split(k: Kind, new: np.ndarray) -> tuple[np.ndarray, float]:
    """(per-class time [C] of a session's run, fixed time of a step (s)) of kind ``k`` for the LP
    rows: batched, ``work + σ·new`` and ``w − σ`` (:attr:`Kind.sigma`: a step of b sessions
    takes at least ``w + σ·(b − 1) + their KV reads``); one at a time, ``alone`` and 0."""
    if k.batch_cap == 1:
        return k.work, 0.0
    return k.work + k.sigma * new, k.w_step - k.sigma


def lp_params(problem: Problem, perf, kinds: list[Kind]) -> LpParams:
    """Per-class LP constants; with more than LP_MAX_CLASSES classes, a relaxed instance:
    contexts and new tokens rounded down to a geometric grid and deadlines up (1 %, 2 %, 4 % ...
    steps, the finest giving at most LP_MAX_CLASSES classes): every coefficient of the LP then
    only decreases and every deadline only grows, so its bound is a bound of the real one."""
    classes = problem.classes
    if len(classes) <= LP_MAX_CLASSES:
        rep = [(c.context, c.new, c.deadline_s) for c in classes]
        counts = np.array([c.count for c in classes], dtype=float)
        out_kinds = []
        new = np.array([c.new for c in classes], dtype=float)
        for k in kinds:
            room = problem.gpu.memory_bytes - k.static
            out_kinds.append(LpKind(k.gpus, k.alone, *step_split(k, new), room, k.kv / k.layout.attention_dp,
                                     float(min(c.new for c in classes)), k.layout.attention_dp, k.batch_cap == 1))
        return LpParams(counts, np.array([d if d is not None else np.inf for _, _, d in rep]),
                       np.array([n for _, n, _ in rep], dtype=float), out_kinds, np.arange(len(classes)))
    for pct in (1, 2, 4, 8, 16, 32):  # the finest geometric grid with at most LP_MAX_CLASSES classes
        step = math.log(1 + pct / 100)

        def down(x):
            return int(math.floor(math.exp(math.floor(math.log(max(x, 1)) / step) * step) + 1e-9)) if x > 0 else 0

        def up(d):
            return None if d is None else math.exp(math.ceil(math.log(d) / step) * step)

        keys: dict[tuple, float] = {}
        ckey = []
        for c in classes:
            key = (min(c.context, down(c.context)), max(1, min(c.new, down(c.new))),
                   None if c.deadline_s is None else max(c.deadline_s, up(c.deadline_s)))
            keys[key] = keys.get(key, 0) + c.count
            ckey.append(key)
        if len(keys) <= LP_MAX_CLASSES:
            break
    rel = list(keys)
    pos = {k: i for i, k in enumerate(rel)}
    fake = replace(problem, classes=tuple(SessionClass(i, k[0], k[1], k[2], ("x",) * int(keys[k]))
                                        for i, k in enumerate(rel)))
    rk = instance_kinds(fake, perf, [k.layout for k in kinds])
    out_kinds = []
    new = np.array([k[1] for k in rel], dtype=float)
    for k in rk:
        room = problem.gpu.memory_bytes - k.static
        out_kinds.append(LpKind(k.gpus, k.alone, *step_split(k, new), room, k.kv / k.layout.attention_dp,
                                 float(min(r[1] for r in rel)), k.layout.attention_dp, k.batch_cap == 1))
    return LpParams(np.array([keys[k] for k in rel], dtype=float),
                   np.array([k[2] if k[2] is not None else np.inf for k in rel]),
                   np.array([k[1] for k in rel], dtype=float), out_kinds, np.array([pos[k] for k in ckey]))


@dataclass
class ConfigKind:
    """Constants of one kind for the configuration LP (arrays over classes).

    gpus: GPUs; alone: single-session time (s, inf where one session does not fit); kv: KV bytes
    per GPU [stage, class]; room: bytes per GPU left for KV [stage]; batched: decodes in
    batches; w: fixed time of a step less σ (s); work: KV-read time of a session's steps plus
    σ·new (s); kv1: its first step's KV-read time plus σ (s); cap: batch cap; queue_limits: batch limits b that can leave
    sessions queued (powers of two and the cap)."""

    gpus: int
    alone: np.ndarray
    kv: np.ndarray
    room: np.ndarray
    batched: bool = False
    w: float = 0.0
    work: Optional[np.ndarray] = None
    kv1: Optional[np.ndarray] = None
    cap: int = 1
    queue_limits: tuple = ()


def config_kinds(problem: Problem, kinds: list[Kind]) -> list[ConfigKind]:
    """The configuration LP's view (:class:`ConfigKind`) of every kind of ``kinds``: single-session
    times (inf where one session does not fit), KV averaged over the attention-DP ranks, and for
    batched kinds the per-session work and per-step time of :func:`step_split` with the first
    step's KV read, and the batch limits that can leave sessions queued."""
    classes = problem.classes
    counts = np.array([c.count for c in classes], dtype=float)
    new = np.array([c.new for c in classes], dtype=float)
    ctx = np.array([c.context for c in classes], dtype=float)
    n_all = int(counts.sum())
    ks = []
    for k in kinds:
        alone = np.where(k.fits, k.alone, np.inf)
        room = problem.gpu.memory_bytes - k.static
        kv = k.kv / k.layout.attention_dp
        if k.batch_cap == 1:
            ks.append(ConfigKind(k.gpus, alone, kv, room))
            continue
        positions = new * ctx + new * (new + 1) / 2
        # σ per slot-step (Kind.sigma): a session's run costs work + σ·new, a step w − σ
        # (step_split, as in the fluid LP), a slot-step kv1 + σ
        work, w = step_split(k, new)
        kv1 = k.work * (ctx + 1) / np.maximum(positions, 1e-12) + k.sigma
        limits = sorted({b for b in (2 ** i for i in range(31)) if b < min(n_all, k.batch_cap)} |
                        ({k.batch_cap} if k.batch_cap < n_all else set()))
        ks.append(ConfigKind(k.gpus, alone, kv, room, True, w, work, kv1, k.batch_cap, tuple(limits)))
    return ks


# ---------------------------------------------------------------------------- solver-unit views
# The exact formulations read the same constants in their own units: CP-SAT needs integers
# (bytes rounded so that memory stays feasible, service times in ticks rounded up:
# optimizer.deployment.units), the batched configurations exact bytes.

@dataclass(frozen=True)
class Option:
    """Per-degree constants of the performance model, in solver units.

    Attributes:
        degree: TP degree p.
        static_bytes: weights + norms + reserve per GPU (bytes, exact).
        room_bytes: memory left for KV per GPU, rounded down (bytes, may be negative).
        kv_bytes: per class, KV bytes per GPU per session, rounded up.
        cap: per class, how many such sessions fit one instance.
        service_s: per class, service time in seconds (exact).
        ticks: per class, service time in ticks (rounded up).
    """

    degree: int
    static_bytes: float
    room_bytes: int
    kv_bytes: tuple[int, ...]
    cap: tuple[int, ...]
    service_s: tuple[float, ...]
    ticks: tuple[int, ...]


def build_options(problem: Problem, perf: PerfModel, degrees) -> dict[int, Option]:
    out = {}
    for p in degrees:
        static = perf.static_bytes_per_gpu(p)
        room = int(math.floor(problem.gpu.memory_bytes - static))
        kv = tuple(int(math.ceil(perf.kv_bytes_per_gpu(p, c.context, c.new))) for c in problem.classes)
        cap = tuple(max(0, room // k) if k > 0 else len(problem.sessions) for k in kv)
        cap = tuple(min(cp, len(problem.sessions)) if room >= 0 else 0 for cp in cap)
        svc = tuple(perf.service_time_s(p, c.context, c.new) for c in problem.classes)
        out[p] = Option(p, static, room, kv, cap, svc, tuple(ticks_up(s) for s in svc))
    return out


@dataclass(frozen=True)
class LayoutOption:
    """Constants of one layout for the search.

    Attributes:
        layout: the layout; gpus: its GPU count.
        static_bytes: weights + reserve on the fullest GPU (bytes).
        room_bytes: memory left for KV on one GPU (bytes, exact; may be negative).
        kv_bytes: per class, KV bytes a session holds on one GPU of its DP rank (bytes).
        cap: per class, most sessions of that class alone that fit the instance.
    """

    layout: Layout
    gpus: int
    static_bytes: float
    room_bytes: float
    kv_bytes: tuple[float, ...]
    cap: tuple[int, ...]


def layout_options(problem: Problem, perf, layouts) -> dict[Layout, LayoutOption]:
    """Options of the placeable ``layouts`` (``perf``: the deployment PerfModel)."""
    m = perf.model
    out = {}
    for lay in layouts:
        if layout_reason(problem, lay) is not None:
            continue
        static = m.static_bytes_per_gpu(lay)
        room = problem.gpu.memory_bytes - static
        kv = tuple(m.kv_bytes_per_gpu(lay, c.context, c.new) for c in problem.classes)
        cap = tuple(min(c.count, m.max_sessions(lay, c.context, c.new)) if room >= 0 else 0 for c in problem.classes)
        out[lay] = LayoutOption(lay, lay.gpus, static, room, kv, cap)
    return out


def kv_gpus_needed(problem: Problem, perf, degrees=None) -> Optional[float]:
    """A lower bound on the GPUs the sessions' KV caches need, every layout and batch limit
    alike; None when a GPU has no room next to the weights even on the largest replica.

    A replica of ``g`` GPUs holds the whole model's resident weights ``W`` at least once and
    ``reserve`` on each GPU, so its KV room is at most ``g·(M − reserve) − W`` = ``g·(M −
    reserve − W/g)`` ≤ ``g·r`` with ``r = M − reserve − W/g_max`` (``g_max`` the largest layout's
    GPUs); every session holds at least ``kv_token·(context + new)`` bytes for the whole run
    (eq. 6-1; replicated KV heads only add). Replicas share no GPU, so
    ``Σ kv_token·(context+new) / r`` GPUs at least must exist."""
    if problem.tp_only:
        g_max = max(degrees or problem.degrees)
    else:
        g_max = max(lay.gpus for lay in problem.layouts)
    room = problem.gpu.memory_bytes - problem.reserve_bytes - perf.w.resident / g_max
    if room <= 0:
        return None
    return sum(c.count * perf.kv_token * (c.context + c.new) for c in problem.classes) / room
