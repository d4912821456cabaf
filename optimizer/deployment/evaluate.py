"""Independent evaluator: re-checks a deployment plan with the performance model alone.

It knows nothing of the formulation: given instances (degree, GPUs, ordered sessions) it
rebuilds the timeline in exact floating point, checks memory per GPU, GPU use, that every
session is served once, the on-time fraction in every fault scenario, and computes all
objectives (their values are read by the objective objects). The solver's plan must pass this re-check (tests assert it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import Fault, Problem
from optimizer.model.layout import Layout

EPS_S = 1e-9  # deadline comparisons tolerate 1 ns of floating-point noise


@dataclass
class PlannedInstance:
    """One instance of a plan.

    Attributes:
        id: display id, e.g. ``i0``.
        degree: GPUs of the instance (the TP degree of a plain TP instance).
        servers: servers it occupies.
        gpus: global GPU ids (server·G + local), length = degree.
        sessions: session ids in admission order (the i-th lives on attention-DP rank i mod dp).
        layout: its layout (None: TP over ``degree`` GPUs, the TP-only problem).
        max_batch: sessions it decodes at once (1: one after another).
    """

    id: str
    degree: int
    servers: tuple[int, ...]
    gpus: tuple[int, ...]
    sessions: list[str]
    layout: Optional[Layout] = None
    max_batch: int = 1

    @property
    def lay(self) -> Layout:
        return self.layout if self.layout is not None else Layout.tp(self.degree)


@dataclass
class Plan:
    instances: list[PlannedInstance]


@dataclass
class SessionTiming:
    id: str
    instance: str
    start_s: float
    finish_s: float
    deadline_s: Optional[float]

    @property
    def on_time(self) -> bool:
        return self.deadline_s is None or self.finish_s <= self.deadline_s + EPS_S


@dataclass
class ScenarioResult:
    """Outcome of one run (nominal, or with one fault)."""

    label: str
    gpu: Optional[int]
    fault: Optional[Fault]
    sessions: list[SessionTiming]
    makespan_s: float
    on_time: int
    cost_gpu_s: float
    mean_finish_s: float
    energy_kj: float
    gpus_used: int = 0
    servers_used: int = 0
    billed_gpu_s: float = 0.0  # Σ over instances of GPUs × the instance's last finish (s)


@dataclass
class Evaluation:
    problem: Problem
    plan: Plan
    nominal: ScenarioResult
    scenarios: list[ScenarioResult]
    memory_per_gpu: dict[str, float]  # instance id -> bytes per GPU
    violations: list[str] = field(default_factory=list)

    @property
    def worst(self) -> ScenarioResult:
        """The scenario with the highest cost (ties: larger makespan); nominal without faults."""
        pool = self.scenarios or [self.nominal]
        return max(pool, key=lambda r: (r.cost_gpu_s, r.makespan_s, r.mean_finish_s))

    def worst_by(self, objective) -> ScenarioResult:
        """The scenario that decides ``objective``'s value (a deployment objective object)."""
        from objectives.deployment import get

        return get(objective).worst(self)

    def objective_value(self, objective) -> float:
        """``objective``'s value of this plan, in its unit."""
        from objectives.deployment import get

        return get(objective).value(self)

    @property
    def feasible(self) -> bool:
        return not self.violations


def _batched_timeline(perf: PerfModel, inst: PlannedInstance, by_id) -> list[SessionTiming]:
    """Step-by-step continuous batching: sessions start in list order when one of the
    ``max_batch`` slots is free; each step advances every active session by one token and
    takes the shared model's batched step time (one session alone: its single-session step);
    a session finishes at the end of its last step and frees its slot at that boundary. Steps
    between two finishes are evaluated together by the shared model's vectorised
    :class:`~optimizer.model.perf.BatchStepTable` (equal to :meth:`PerfModel.step` to rounding)
    and summed one by one."""
    lay = inst.lay
    steps = perf.steps
    dp = lay.attention_dp
    queue = list(inst.sessions)
    rank = {sid: i % dp for i, sid in enumerate(queue)}
    made = {sid: 0 for sid in queue}
    start: dict[str, float] = {}
    out = []
    active: list[str] = []
    t = 0.0
    while queue or active:
        while queue and len(active) < inst.max_batch:
            sid = queue.pop(0)
            start[sid] = t
            active.append(sid)
        # the active set is fixed until the next finish: its k steps in one vectorised call of
        # the shared model (each step advances every active session by one token)
        k = min(by_id[sid].new - made[sid] for sid in active)
        pos = np.array([by_id[sid].context + made[sid] for sid in active], dtype=np.float64)
        if len(active) == 1:
            dts = steps.single_session_step_s(lay, pos[0] + np.arange(k))
        else:
            dts = steps.batch_steps_s(lay, pos, k, rank=np.array([rank[sid] for sid in active]))
        for dt in dts:
            t += float(dt)
        still = []
        for sid in active:
            made[sid] += k
            if made[sid] == by_id[sid].new:
                out.append(SessionTiming(sid, inst.id, start[sid], t, by_id[sid].deadline_s))
            else:
                still.append(sid)
        active = still
    order = {sid: i for i, sid in enumerate(inst.sessions)}
    return sorted(out, key=lambda r: order[r.id])


def _timeline(perf: PerfModel, problem: Problem, inst: PlannedInstance, fault: Optional[Fault],
              by_id) -> list[SessionTiming]:
    if inst.max_batch > 1:
        return _batched_timeline(perf, inst, by_id)
    out, t = [], 0.0
    hit = False
    memo = perf.__dict__.setdefault("_evaluator_service_s", {})  # identical sessions: one sum
    for sid in inst.sessions:
        s = by_id[sid]
        key = (inst.degree if inst.layout is None else inst.layout, s.context, s.new)
        svc = memo.get(key)
        if svc is None:
            if inst.layout is None:
                svc = perf.service_time_s(inst.degree, s.context, s.new)
            else:
                svc = float(perf.steps.single_session_step_s(inst.layout, np.arange(s.context, s.context + s.new)).sum())
            memo[key] = svc
        start, finish = t, t + svc
        if fault is not None and not hit and finish > fault.at_s:
            hit = True  # running at the fault: restart from the first step after the stall
            start = fault.at_s + fault.stall_s
            finish = start + svc
        out.append(SessionTiming(sid, inst.id, start, finish, s.deadline_s))
        t = finish
    return out


def _scenario(perf, problem, plan, label, gpu, fault, by_id) -> ScenarioResult:
    timings = []
    for inst in plan.instances:
        f = fault if (fault is not None and gpu in inst.gpus) else None
        timings += _timeline(perf, problem, inst, f, by_id)
    return scenario_from_timings(problem, plan, timings, label, gpu, fault)


def scenario_from_timings(problem: Problem, plan: Plan, timings: list[SessionTiming], label: str = "nominal",
                          gpu: Optional[int] = None, fault: Optional[Fault] = None) -> ScenarioResult:
    """The objectives' inputs of one run from its session timings (``timings[i].instance`` is
    an instance id of ``plan``): makespan (s), on-time count, cost ``G·makespan/on`` (GPU·s per
    on-time session), mean finish (s), energy ``server power · servers · makespan`` (kJ), GPUs
    and servers in instances, and GPU·s billed per instance until its last finish."""
    makespan = max((t.finish_s for t in timings), default=0.0)
    on = sum(t.on_time for t in timings)
    cost = problem.total_gpus * makespan / on if on else float("inf")
    mean = sum(t.finish_s for t in timings) / len(timings) if timings else 0.0
    energy = problem.server.power_w * problem.servers * makespan / 1e3
    finish = {}
    for t in timings:
        finish[t.instance] = max(finish.get(t.instance, 0.0), t.finish_s)
    billed = sum(inst.degree * finish.get(inst.id, 0.0) for inst in plan.instances)
    gpus_used = sum(inst.degree for inst in plan.instances)
    servers_used = len({s for inst in plan.instances for s in inst.servers})
    return ScenarioResult(label, gpu, fault, timings, makespan, on, cost, mean, energy, gpus_used, servers_used,
                          billed)


def evaluate(problem: Problem, plan: Plan, perf: Optional[PerfModel] = None) -> Evaluation:
    """Re-check ``plan`` against ``problem``.

    Returns:
        Evaluation with the nominal run, one scenario per (fault, GPU) — a fault without
        ``gpu`` expands to every GPU of every server — memory per GPU per instance, and the
        list of violated limits (empty when the plan is valid).
    """
    perf = perf or PerfModel(problem)
    by_id = {s.id: s for s in problem.sessions}
    G = problem.server.gpus
    violations: list[str] = []
    seen: dict[str, str] = {}
    gpu_owner: dict[int, str] = {}
    memory: dict[str, float] = {}
    for inst in plan.instances:
        if inst.layout is None and inst.degree not in problem.degrees:
            violations.append(f"{inst.id}: TP{inst.degree} is not an allowed degree")
        if inst.layout is not None and inst.layout not in problem.layouts:
            violations.append(f"{inst.id}: layout {inst.layout.label()} is not an allowed layout")
        if inst.layout is not None and inst.layout.gpus != inst.degree:
            violations.append(f"{inst.id}: layout {inst.layout.label()} has {inst.layout.gpus} GPUs, not {inst.degree}")
        if inst.max_batch < 1 or (problem.max_batch is not None and inst.max_batch > problem.max_batch):
            violations.append(f"{inst.id}: batch limit {inst.max_batch} is not within 1..deployment.max_batch {problem.max_batch}")
        if inst.max_batch > 1 and problem.faults:
            violations.append(f"{inst.id}: batched decode under faults is not simulated")
        if len(inst.gpus) != inst.degree or len(set(inst.gpus)) != inst.degree:
            violations.append(f"{inst.id}: has {len(set(inst.gpus))} distinct GPUs for {inst.lay.label()}")
        for g in inst.gpus:
            if not 0 <= g < problem.total_gpus:
                violations.append(f"{inst.id}: GPU {g} does not exist")
            elif g in gpu_owner:
                violations.append(f"GPU {g} is used by {gpu_owner[g]} and {inst.id}")
            gpu_owner[g] = inst.id
        if inst.degree <= G and len({g // G for g in inst.gpus}) > 1:
            violations.append(f"{inst.id}: TP{inst.degree} fits one server but spans several")
        if not inst.sessions:
            violations.append(f"{inst.id}: serves no session")
        for sid in inst.sessions:
            if sid not in by_id:
                violations.append(f"{inst.id}: unknown session {sid}")
            elif sid in seen:
                violations.append(f"session {sid} is on {seen[sid]} and {inst.id}")
            seen[sid] = inst.id
        known = [by_id[s] for s in inst.sessions if s in by_id]
        if inst.layout is None:
            mem = perf.memory_per_gpu(inst.degree, [(s.context, s.new) for s in known])
        else:  # the i-th session in admission order lives on attention-DP rank i mod dp
            dp = inst.layout.attention_dp
            mem = perf.model.memory_per_gpu(inst.layout, [(s.context, s.new) for s in known],
                                            [i % dp for i in range(len(known))])
        memory[inst.id] = mem
        if mem > problem.gpu.memory_bytes * (1 + 1e-12):
            violations.append(f"{inst.id}: needs {mem / 1e9:.2f} GB per GPU > {problem.gpu.memory_bytes / 1e9:g} GB")
    missing = [s.id for s in problem.sessions if s.id not in seen]
    if missing:
        violations.append(f"sessions not served: {', '.join(missing[:5])}{'...' if len(missing) > 5 else ''}")
    if violations:
        nominal = ScenarioResult("nominal", None, None, [], 0.0, 0, float("inf"), 0.0, 0.0)
        return Evaluation(problem, plan, nominal, [], memory, violations)

    nominal = _scenario(perf, problem, plan, "nominal", None, None, by_id)
    need = problem.required_on_time
    if nominal.on_time < need:
        violations.append(f"nominal: {nominal.on_time} of {len(problem.sessions)} on time < {need} required")
    scenarios: list[ScenarioResult] = []
    for fi, fault in enumerate(problem.faults):
        gpus = range(problem.total_gpus) if fault.gpu is None else [fault.gpu]
        for g in gpus:
            r = _scenario(perf, problem, plan, f"fault{fi} gpu {g}", g, fault, by_id)
            scenarios.append(r)
            if r.on_time < need:
                violations.append(f"fault{fi} on GPU {g}: {r.on_time} of {len(problem.sessions)} on time < {need} required")
    return Evaluation(problem, plan, nominal, scenarios, memory, violations)
