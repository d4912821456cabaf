"""Large-neighbourhood search (LNS) on the real instance: free a few instances, re-decide them exactly.

The local moves of :meth:`~optimizer.deployment.anytime.Anytime.improve` move one or two
sessions at a time and keep every instance's width; they stall when the plan needs a different
instance mix (e.g. a TP8 for the longest sessions where the plan runs TP4). Each LNS step here:

1. **Destroys** a neighbourhood: a few instances (those that finish last, or that run late
   sessions, plus instances with slack chosen at random) and their sessions; their GPUs plus
   the idle GPUs form a budget ``B``.
2. **Repairs** it with a small CP-SAT model that chooses new instances of any kind within ``B``
   GPUs and assigns the freed sessions to them, subject to a makespan target ``T_sub``
   (below the current makespan when every instance finishing after it is freed, else the
   current makespan), maximising the on-time sessions (then minimising the largest load). It
   requires enough on-time sessions for the global objective to improve, so a useless
   neighbourhood is refuted fast.
3. **Accepts** the new plan when the objective of the whole plan, re-simulated exactly by
   :meth:`~optimizer.deployment.anytime.Anytime.run`, improves.

Every ``RESCUE_EVERY``-th step instead moves late sessions (alone, or swapped with a session of
the target, or into an instance twice as wide) to where they are on time, each candidate
simulated exactly (:meth:`~optimizer.deployment.anytime.Anytime.rescue_late`): with batching a
session with a tight deadline is late on an instance with many co-running sessions, a case the
surrogate of the repair model sees only roughly.

While a plan short of the on-time requirement is repaired (``Anytime.repairing``: its score is
the shortfall first), every step frees instances with late sessions and the repair must put one
more session on time than before, within ``REPAIR_SLACK`` x the makespan.

Repair model (instance slots ``j`` of kind ``k`` with ``g_k`` GPUs, freed sessions ``s``):
``open_j ∈ {0,1}``, ``x_sj ∈ {0,1}`` (s runs on j), ``y_sj ≤ x_sj`` (s on time on j);
``Σ_j x_sj = 1``; ``Σ_j g_j·open_j ≤ B``; ``x_sj ≤ open_j``; memory per pipeline stage
``Σ_s kv_s·x_sj ≤ (HBM − static)·open_j``; and a time model per instance:

* one session at a time (exact): load ``Σ_s t_s·x_sj ≤ T_sub`` and, for every deadline ``d``
  below ``T_sub``, ``Σ_{s: d_s ≤ d} t_s·y_sj ≤ d`` (the on-time sessions in deadline order
  meet their deadlines; Moore-Hodgson then finds at least as many on time). Service times
  are rounded up to ticks and deadlines down (:mod:`optimizer.deployment.units`), so the
  model is conservative;
* batched decode (a surrogate, checked by the exact simulation before acceptance): every step
  reads the weights and the KV cache of the sessions still decoding (shared-model eq. 6-2), so
  an instance takes about ``w·max_s new_s + Σ_s work_s`` (``work``: the session's own KV reads,
  :class:`~optimizer.deployment.params.Kind`) and session ``s`` finishes after about
  ``w·new_s + Σ_{s'} work_{s'}·min(1, new_s/new_{s'})``; both are scaled by the ratio of the
  simulated to the surrogate makespan observed on the freed instances (at least 1).

Randomness is seeded, so a run with the same budget explores the same neighbourhoods.
"""
from __future__ import annotations

import math
import random
import time
from typing import Callable, Optional

import numpy as np

from optimizer.cpsat import NamedModel, ortools_cp_model
from optimizer.deployment.params import Inst
from optimizer.deployment.units import ticks_down, ticks_up
from optimizer.result import ConstraintKey

MAX_SESSIONS = 40  # freed sessions per neighbourhood
MAX_SLOTS_PER_KIND = 10  # candidate instances of one kind in the repair model
SUB_TIME_S = 0.3  # CP-SAT time per repair (most repairs of a plan full to its makespan end without a solution:
#   more, shorter tries pay; 200 distinct sessions one at a time, 60 s: 0.6 s -> 5.34 %, 0.3 s -> 4.75-5.00 %)
SLACK_WEIGHT = 20.0  # weight of an instance's idle share (1 - its makespan / the plan's) when fillers are drawn
#   (3 -> 20: 4.75-5.00 % -> 4.34-4.56 % on the same case)
REPAIR_WORKERS = 2  # CP-SAT workers per repair (the target machine has 2 cores)
KIB = 1024
RESCUE_EVERY = 5  # every 5th step moves late sessions to where they are on time, simulated exactly
RESCUE_SLICE_S = 1.0  # at most this long per such step
REPAIR_SLACK = 1.25  # while repairing towards the on-time requirement, a neighbourhood may end this much later


def lns(A, insts: list, deadline: float, on_better: Optional[Callable] = None, seed: int = 0,
        bound: Optional[float] = None) -> list:
    """Improve ``insts`` (a list of :class:`~optimizer.deployment.params.Inst` of ``A``) by
    LNS until ``deadline`` (``time.perf_counter()`` value) or until the value meets ``bound``.

    Returns:
        list[Inst]: the best plan found (``insts`` itself when nothing improved).
    """
    rng = random.Random(seed)
    insts = [it for it in insts if it.sessions]
    cur = A.score(insts)
    G = A.problem.total_gpus
    delta = 0.02  # relative makespan cut tried by a "shrink" step; adapts to success
    step = 0
    while time.perf_counter() < deadline - 0.02:
        if bound is not None and cur <= bound * (1 + 1e-9):
            break
        step += 1
        ms = np.array([it.makespan for it in insts])
        M = float(ms.max())
        late = [sum(1 for i, f in zip(it.order, it.finish) if f > A.dl[i] + 1e-9) for it in insts]
        if A.tradeoff is not None:  # the batch limit rule follows the plan's exchange rate
            A.tradeoff = M / max(1, len(A.sess) - sum(late))
        used = sum(A.kinds[it.kind].gpus for it in insts)
        if any(late) and step % RESCUE_EVERY == 0:  # exact moves of late sessions (Anytime.rescue_late)
            moved = A.rescue_late(insts, cur, min(deadline, time.perf_counter() + RESCUE_SLICE_S))
            if moved is not None:
                insts, cur = moved
                if on_better is not None:
                    on_better(insts, cur)
            continue
        mode = "shrink" if (step % 3 != 0 or not any(late)) and not A.repairing else "late"
        if mode == "shrink":
            target = M * (1 - delta)
            core = [j for j in range(len(insts)) if ms[j] > target]
            if sum(len(insts[j].sessions) for j in core) > MAX_SESSIONS:
                delta = max(delta / 2, 1e-4)
                if delta <= 1e-4:
                    mode = "late" if any(late) else "random"
                    core = []
                else:
                    continue
        if mode != "shrink":
            target = M
            if mode == "late":
                with_late = [j for j in range(len(insts)) if late[j]]
                rng.shuffle(with_late)
                core = with_late[: rng.randint(1, 3)]
            else:
                core = [rng.randrange(len(insts))]
        chosen = _fill(A, insts, core, ms, rng)
        sessions = [i for j in chosen for i in insts[j].sessions]
        budget = G - used + sum(A.kinds[insts[j].kind].gpus for j in chosen)
        rest = [it for j, it in enumerate(insts) if j not in set(chosen)]
        v_rest = sum(int(np.sum(it.finish <= A.dl[it.order] + 1e-9)) for it in rest)
        v_sub = sum(int(np.sum(insts[j].finish <= A.dl[insts[j].order] + 1e-9)) for j in chosen)
        m_rest = max((it.makespan for it in rest), default=0.0)
        t_sub = target if mode == "shrink" else M * (REPAIR_SLACK if A.repairing else 1.0)
        t_sub = max(t_sub, m_rest) if mode != "shrink" else t_sub
        # enough on time for the objective to improve: cost G·T/v < cur
        need = _need_on_time(A, cur, max(t_sub, m_rest), v_rest, v_sub, mode)
        left = deadline - time.perf_counter()
        if left < 0.05:
            break
        # half the steps re-pack onto the same kinds (a small, fast model), half choose kinds
        same = [insts[j].kind for j in chosen] if rng.random() < 0.5 else None
        new = repair(A, sessions, budget, t_sub, need, min(SUB_TIME_S, left - 0.02),
                     [insts[j] for j in chosen], seed + step, kinds=same)
        v = A.score(rest + new) if new is not None else math.inf
        accepted = v < cur * (1 - 1e-12)
        if accepted:
            insts, cur = rest + new, v
            if on_better is not None:
                on_better(insts, v)
        if mode == "shrink":  # a bolder cut after a success, a smaller one after a failure
            delta = min(0.1, delta * 1.5) if accepted else max(delta / 2, 1e-4)
    return insts


def _need_on_time(A, cur: float, makespan: float, v_rest: int, v_sub: int, mode: str) -> int:
    """Fewest on-time sessions the repaired neighbourhood must have for the plan to improve:
    more than the present ones in a "late"/"random" step; in a "shrink" step, enough that
    ``G·makespan/(v_rest + v)`` beats ``cur`` for the cost objective (the present count for
    the others), and the global on-time requirement holds; one more than the present ones while
    the plan is repaired towards that requirement (:attr:`Anytime.repairing`)."""
    if A.repairing:  # short of the requirement: any gain in on-time sessions is progress
        return v_sub + 1
    floor = max(0, A.need - v_rest)
    if mode != "shrink":
        return max(floor, v_sub + 1)
    if A.obj.search == "cost" and math.isfinite(cur) and cur > 0:
        G = A.problem.total_gpus
        want = G * makespan / cur - v_rest  # v > G·M/cur − v_rest
        return max(floor, int(math.floor(want + 1e-9)) + 1 if want > 0 else 0)
    return max(floor, v_sub)  # makespan-like objectives: keep the on-time count


def _fill(A, insts, core: list[int], ms: np.ndarray, rng: random.Random) -> list[int]:
    """``core`` plus 2-6 instances chosen at random, weighted ``1 + SLACK_WEIGHT·(1 − makespan/M)``
    (those with idle time first), while the freed sessions stay within :data:`MAX_SESSIONS`."""
    chosen = list(core)
    n = sum(len(insts[j].sessions) for j in chosen)
    others = [j for j in range(len(insts)) if j not in set(core)]
    if not others:
        return chosen
    M = float(ms.max()) if len(ms) else 1.0
    w = np.array([1.0 + SLACK_WEIGHT * (1.0 - ms[j] / M) for j in others])
    want = rng.randint(2, 6)
    while others and len(chosen) < len(core) + want:
        p = w / w.sum()
        pick = int(rng.choices(range(len(others)), weights=p)[0])
        j = others.pop(pick)
        w = np.delete(w, pick)
        if n + len(insts[j].sessions) > MAX_SESSIONS:
            continue
        chosen.append(j)
        n += len(insts[j].sessions)
    return chosen


def repair(A, sessions: list[int], budget: int, t_sub: float, need: int, time_s: float, old: list,
           seed: int = 0, kinds: Optional[list[int]] = None) -> Optional[list]:
    """Re-decide ``sessions`` on new instances of at most ``budget`` GPUs (module docstring),
    of the kinds (indices into ``A.kinds``) in ``kinds`` when given, else of any kinds:
    the instances (run by ``A.run``) or None when the model finds no plan with ``need`` on time
    in ``time_s`` seconds, or when the simulated plan misses ``t_sub``."""
    if time_s <= 0.02 or not sessions:
        return None
    batched = any(A.kinds[k].batch_cap > 1 for k in range(len(A.kinds)))
    scale = 1.0
    if batched:
        ratios = [it.makespan / max(_surrogate(A, it.kind, it.sessions), 1e-12) for it in old if it.sessions]
        scale = max([1.0] + ratios)
    m = NamedModel()
    mdl = m.model
    T = ticks_down(t_sub)
    slots = []  # (kind, open var)
    if kinds is None:
        for k, kd in enumerate(A.kinds):
            if kd.gpus > budget:
                continue
            if not any(kd.fits[A.cls[i]] and kd.alone[A.cls[i]] <= t_sub for i in sessions):
                continue
            for n in range(min(budget // kd.gpus, len(sessions), MAX_SLOTS_PER_KIND)):
                slots.append((k, mdl.new_bool_var(f"open[{kd.layout.label()}#{n}]")))
    else:  # a fixed multiset of kinds (each slot may stay empty)
        for n, k in enumerate(sorted(kinds)):
            slots.append((k, mdl.new_bool_var(f"open[{A.kinds[k].layout.label()}#{n}]")))
    if not slots:
        return None
    x: dict[tuple[int, int], object] = {}
    y: dict[tuple[int, int], object] = {}
    for j, (k, op) in enumerate(slots):
        kd = A.kinds[k]
        for i in sessions:
            c = A.cls[i]
            if not kd.fits[c] or kd.alone[c] > t_sub:
                continue
            x[i, j] = mdl.new_bool_var(f"x[{i},{j}]")
            if kd.alone[c] <= A.dl[i] + 1e-12:
                y[i, j] = x[i, j] if A.dl[i] >= t_sub else mdl.new_bool_var(f"y[{i},{j}]")
    for i in sessions:
        opts = [x[i, j] for j in range(len(slots)) if (i, j) in x]
        if not opts:
            return None
        m.add(ConstraintKey("assignment", f"session {A.sess[i].id}"), sum(opts) == 1)
    m.add(ConstraintKey("gpus", "neighbourhood"), sum(A.kinds[k].gpus * op for k, op in slots) <= budget)
    on = []
    lmax = mdl.new_int_var(0, max(T, 0), "lmax")
    for j, (k, op) in enumerate(slots):
        kd = A.kinds[k]
        here = [i for i in sessions if (i, j) in x]
        name = f"slot {kd.layout.label()}#{j}"
        for i in here:
            mdl.add_implication(x[i, j], op)
            if (i, j) in y and y[i, j] is not x[i, j]:
                mdl.add_implication(y[i, j], x[i, j])
                on.append(y[i, j])
            elif (i, j) in y:
                on.append(x[i, j])
        if j > 0 and slots[j - 1][0] == k:  # identical slots open in order
            mdl.add_implication(op, slots[j - 1][1])
        room = A.mem - kd.static
        for st in range(kd.kv.shape[0]):
            terms = [(int(math.ceil(kd.kv[st, A.cls[i]] / KIB)), x[i, j]) for i in here if kd.kv[st, A.cls[i]] > 0]
            if terms:
                m.add(ConstraintKey("memory", f"{name}, stage {st}"),
                      sum(a * v for a, v in terms) <= int(math.floor(room[st] / KIB)) * op)
        if not batched:
            load = sum(ticks_up(kd.alone[A.cls[i]]) * x[i, j] for i in here)
            m.add(ConstraintKey("makespan", name), load <= T)
            mdl.add(lmax >= load)
            dls = sorted({A.dl[i] for i in here if (i, j) in y and A.dl[i] < t_sub})
            for d in dls:
                terms = [ticks_up(kd.alone[A.cls[i]]) * y[i, j] for i in here
                         if (i, j) in y and y[i, j] is not x[i, j] and A.dl[i] <= d]
                if terms:
                    m.add(ConstraintKey("deadline", f"{name}, {d * 1e3:.1f} ms"), sum(terms) <= ticks_down(d))
        else:
            w = kd.w_step * scale
            work = {i: kd.est[A.cls[i]] * scale for i in here}
            steps = mdl.new_int_var(0, max(A.sess[i].new for i in here) if here else 0, f"steps[{j}]")
            for i in here:
                mdl.add(steps >= A.sess[i].new * x[i, j])
            load = ticks_up(w) * steps + sum(ticks_up(work[i]) * x[i, j] for i in here)
            m.add(ConstraintKey("makespan", name), load <= T)
            mdl.add(lmax >= load)
            for i in here:
                if (i, j) not in y or y[i, j] is x[i, j]:
                    continue
                ni = A.sess[i].new
                fin = ticks_up(w * ni) * y[i, j] + sum(
                    ticks_up(work[s] * min(1.0, ni / A.sess[s].new)) * x[s, j] for s in here if s != i) + \
                    ticks_up(work[i]) * y[i, j]
                big = ticks_up(w * ni) + sum(ticks_up(work[s] * min(1.0, ni / A.sess[s].new)) for s in here)
                m.add(ConstraintKey("deadline", f"{name}, session {A.sess[i].id}"),
                      fin <= ticks_down(A.dl[i]) + big * (1 - y[i, j]))
    if need > 0:
        if len(on) < need:
            return None
        m.add(ConstraintKey("on_time", "neighbourhood"), sum(on) >= need)
    big = max(T, 1) + 1
    mdl.maximize(big * sum(on) - lmax)
    _hint(A, mdl, old, slots, x, y)
    cp_model = ortools_cp_model()
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_s)
    solver.parameters.num_workers = REPAIR_WORKERS
    solver.parameters.random_seed = seed % 1000
    st = solver.solve(mdl)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None

    out = []
    for j, (k, op) in enumerate(slots):
        if not solver.boolean_value(op):
            continue
        members = [i for i in sessions if (i, j) in x and solver.boolean_value(x[i, j])]
        if members:
            out.append(A.run(Inst(k, members)))
    if any(it.makespan > t_sub * (1 + 1e-9) for it in out):
        return None  # the batched surrogate was optimistic here
    return out


def _surrogate(A, k: int, sessions: list[int]) -> float:
    """Surrogate batched makespan ``w·max new + Σ work`` (s) of ``sessions`` on kind ``k`` (work
    with each step's growth per session, :attr:`~optimizer.deployment.params.Kind.est`)."""
    kd = A.kinds[k]
    return kd.w_step * max(A.sess[i].new for i in sessions) + float(sum(kd.est[A.cls[i]] for i in sessions))


def _hint(A, mdl, old: list, slots, x, y) -> None:
    """The freed instances as a solution hint (slots of the same kind in order)."""
    taken: set[int] = set()
    for it in old:
        j = next((j for j, (k, _) in enumerate(slots) if k == it.kind and j not in taken), None)
        if j is None:
            return
        taken.add(j)
        if not all((i, j) in x for i in it.sessions):
            continue
        mdl.add_hint(slots[j][1], 1)
        for i in it.sessions:
            mdl.add_hint(x[i, j], 1)
