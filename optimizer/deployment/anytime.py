"""Anytime solving of the deployment problem at traffic scale: a plan first, a bound early.

Real request logs have thousands of distinct (context, new tokens, deadline) triples, so the
exact configuration search (one column per multiset of session classes) cannot even enumerate
its columns. This module keeps the solve useful whatever the size (no faults; every layout and
batch limit of :mod:`optimizer.deployment.batching`):

1. **A plan first** (:meth:`Anytime.construct`): earliest-deadline list scheduling over a
   greedy instance mix. A *mix* fixes how many instances of each layout run (all GPUs of one
   layout, or two layouts sharing the GPUs in quarters, or the LP relaxation's mix rounded).
   Sessions are taken in deadline order; each goes to the instance where it finishes earliest
   (one session at a time: its single-session service time after the instance's load; batched:
   a load proxy ``w·steps + Σ KV reads``), memory permitting; sessions that cannot be on time
   anywhere are placed last. Each instance then runs its sessions in the search's admission
   order (Moore-Hodgson for one at a time, earliest deadline first when batched) with the best
   batch limit of :func:`~optimizer.deployment.batching.batch_limits`.
   A second constructor, :meth:`Anytime.pack`, packs the sessions into the LP solution's
   instance mix at a makespan target (First Fit Decreasing with deadlines).
2. **Local improvement** (:meth:`Anytime.improve`): moves and swaps of sessions out of the
   instance that finishes last, each re-simulated exactly, accepted when the objective
   (read by the objective object from :func:`~optimizer.deployment.evaluate.scenario_from_timings`)
   does not get worse and the last instance finishes earlier (a bounded number of such
   plateau moves in a row); then merging that instance with another of its kind into one twice
   as wide; then moving a late session (or merging two instances into a wider one for it) where
   it is on time, when the objective improves.
3. **A bound early** (:func:`lp_bound`): an LP relaxation over (session class, layout) with
   continuous instance counts, solved by HiGHS. For a makespan threshold T it maximises the
   on-time sessions subject to (per layout L with n_L instances of g_L GPUs):
   ``Σ_L g_L·n_L ≤ GPUs``; every session served once; memory
   ``Σ kv·x ≤ n_L·(HBM − static)`` per pipeline stage (KV is resident for the whole run; with
   attention DP the fullest rank holds at least the average); time
   ``Σ work·x + n_L·w_L·min_new ≤ n_L·T`` and, for every deadline d in a set D,
   ``Σ_{d_c ≤ d} work·y ≤ n_L·d`` (the on-time sessions of deadline ≤ d finish by d on their
   instance: the EDD prefix condition summed over instances); a session may use L only when
   its single-session time on L is ≤ T (a batched step is never faster than a single-session
   one), and be on time only when that time is ≤ its deadline. ``work`` is the single-session
   service time when instances decode one session at a time, and the KV-read time of the
   session's steps when batched (every step reads every active session's KV once; a step is at
   least its HBM time ``(weights + KV of the fullest rank)/bandwidth``, shared-model eq. 6-2,
   plus the collectives of a one-token step), with ``w_L`` that fixed time of one step; every
   session in a step adds at least σ_L more (its share of the collectives and hand-offs, which
   grow with the batch: :func:`session_step_floor`), so batched ``work`` counts ``σ_L·new``
   more and ``w_L`` is the fixed time less σ_L (a step of b sessions: ``w_L + σ_L·b`` + KV). Batched
   kinds also get a *staircase*: ``m_{L,ν}`` instances decode at least ν tokens (for a grid of
   ν), ``Σ_{new_c ≥ ν} work·x ≤ m_{L,ν}·(T − w_L·ν)``, their KV fits ``m_{L,ν}·(HBM − static)``,
   ``m_{L,ν}`` falls with ν, and the time row counts ``w_L·Σ_ν (ν − ν_prev)·m_{L,ν}`` weight
   reads instead of ``n_L·w_L·min_new``; each staircase row also charges its ``m_{L,ν}``
   instances for the weight reads of their steps beyond ν (``w_L·Σ_{ν'>ν} (ν' − ν'_prev)·m_{L,ν'}``:
   an instance decoding ≥ ν' tokens is among those decoding ≥ ν). The cost ``G·M/v`` is then at least
   ``G·T_k / v_max(T_{k+1})`` on every interval ``[T_k, T_{k+1})`` of a grid of thresholds
   (refined where the minimum is), the makespan at least the largest T whose LP cannot reach
   the on-time requirement. With very many classes the LP is built on a relaxed instance
   (contexts and new tokens rounded down, deadlines up), which only lowers the bound; the
   makespan floor (the longest session alone on the fastest kind it fits) is taken from the
   real classes. With few classes, the thresholds that decide the cost (or makespan)
   bound are then tightened by the configuration LP of :mod:`optimizer.deployment.colgen`
   (column generation; its Farley bound holds at every iteration), whose integer master also
   gives plans (:meth:`BoundLP.refine_cost_bound`).
4. **Aggregation** (:func:`rounded_problem`): sessions in exact-equality classes first; when
   there are too many, a rounded instance (contexts and new tokens rounded up to a few grid
   values, deadlines down) is solved by the exact configuration search; its plans, with the same
   session ids, are feasible for the real instance (service times and memory grow with length)
   and are re-evaluated on it, then improved by step 2.

Every plan returned is re-checked by the independent evaluator.
"""
from __future__ import annotations

import math
from functools import cached_property
import time
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Optional

import numpy as np

from optimizer.deployment.evaluate import Plan, SessionTiming, scenario_from_timings
from optimizer.deployment.packing import pack_on_servers
from optimizer.deployment.params import (Inst, Kind, LpParams, instance_kinds, lp_params, session_step_floor,
                                         step_split)
from optimizer.deployment.schema import Problem, SessionClass
from optimizer.deployment.units import TIME_UNIT_S, ticks_up
from optimizer.model.layout import Layout
from optimizer.model.weights import ACTIVATION_BYTES

EPS_S = 1e-9
SHORTFALL_PENALTY = 1e9  # score per session missing from the on-time requirement while repairing
REBALANCE_ROUNDS = 40  # sweeps of Anytime.rebalance
REBALANCE_PAIR_STEPS = 3  # moves or swaps per pair and sweep
REBALANCE_TRIES = 8  # candidates of a pair simulated (the best by the arithmetic load)
RUN_MEMO = 200_000  # instance timelines kept by Anytime.run (cleared beyond)
DEADLINE_ROWS = 40  # deadline values with an EDD row in the bound LP
# HiGHS options tried in turn when an LP ends neither optimal nor infeasible
LP_RETRIES = (("presolve", "off"), ("solver", "ipm"))
STAIRCASE_STEPS = 16
DEAL_SESSIONS = 20_000  # above this many sessions the first plans are dealt out in turn (Anytime.deal)
DEAL_MIXES = 3  # mixes dealt out before the greedy plans
PACK_CANDIDATES = 32  # instances of one kind whose deadlines Anytime.pack checks per session  # decode-length thresholds of the batched staircase rows in the bound LP


class Anytime:
    """Constructive plans, local improvement and bounds for one problem (no faults)."""

    def __init__(self, problem: Problem, perf, objective, layouts):
        self.problem = problem
        self.perf = perf
        self.obj = objective
        self.kinds = instance_kinds(problem, perf, layouts)
        self.sess = problem.sessions
        self.cls = np.array([s.cls for s in self.sess], dtype=np.int64)
        self.dl = np.array([s.deadline_s if s.deadline_s is not None else np.inf for s in self.sess])
        self.mem = problem.gpu.memory_bytes * (1 - 1e-9)
        self.need = max(problem.required_on_time, objective.min_on_time)
        # batch limit rule of :meth:`run`: None, the most sessions on time (then the shortest
        # makespan); a number μ (s per on-time session), the least ``makespan − μ·on time``
        self.tradeoff: Optional[float] = None
        self.rule_of: dict[int, Optional[float]] = {}  # the rule each constructive plan was run under
        self.stop_at: Optional[float] = None  # greedy plans give up at this time (perf_counter)
        self._runs: dict[tuple, tuple] = {}  # memo of :meth:`run`: (order positions, batch, finish)
        self.repairing = False  # score plans short of the on-time requirement by the shortfall

    # ------------------------------------------------------------------ one instance
    def run(self, inst: Inst) -> Inst:
        """Admission order, batch limit and finish times of ``inst`` (search rules of
        :mod:`optimizer.deployment.batching`)."""
        k = self.kinds[inst.kind]
        if not inst.sessions:
            inst.order, inst.finish, inst.batch = [], np.zeros(0), 1
            return inst
        # sessions of one class are interchangeable: the timeline depends only on the kind, the
        # rule and the class sequence (sorted by class), so it is computed once per such key
        idx = sorted(inst.sessions, key=lambda i: (self.cls[i], i))
        memo_key = (inst.kind, self.tradeoff, tuple(self.cls[idx].tolist()))
        got = self._runs.get(memo_key)
        if got is None:
            got = self._best_timeline(k, idx)
            if len(self._runs) > RUN_MEMO:
                self._runs.clear()
            self._runs[memo_key] = got
        order, inst.batch, inst.finish = got
        inst.order = [idx[o] for o in order]
        return inst

    def _best_timeline(self, k: "Kind", idx: list[int]) -> tuple[list[int], int, np.ndarray]:
        """(admission order as positions in ``idx``, batch limit, finish times s in that order)
        of sessions ``idx`` on kind ``k``: the batch limit best under the present rule."""
        from optimizer.deployment.batching import admission_order, batch_limits, simulate

        ticks = [ticks_up(k.alone[self.cls[i]]) for i in idx]
        jobs = [(self.sess[i].context, self.sess[i].new, self.sess[i].deadline_s) for i in idx]
        best = None
        for b in batch_limits(len(idx), k.batch_cap):
            order = admission_order(jobs, ticks, b)
            if b == 1:
                fin = np.cumsum([k.alone[self.cls[idx[o]]] for o in order])
            else:
                fin = np.array(simulate(self.perf, k.layout, [(jobs[o][0], jobs[o][1]) for o in order], b)[1])
            on = int(np.sum(fin <= self.dl[[idx[o] for o in order]] + EPS_S))
            if self.tradeoff is None:
                key = (-on, float(fin.max()))
            else:
                key = (float(fin.max()) - self.tradeoff * on, -on)
            if best is None or key < best[0]:
                best = (key, order, b, fin)
        return best[1:]

    def rerun(self, insts: list[Inst]) -> list[Inst]:
        """``insts`` run again under the present batch limit rule."""
        return [self.run(Inst(it.kind, list(it.sessions))) for it in insts if it.sessions]

    def choose_rule(self, insts: list[Inst]) -> list[Inst]:
        """Set the batch limit rule (:attr:`tradeoff`) that gives ``insts`` the better objective:
        most sessions on time, or the exchange rate ``makespan/on time`` of the plan (a batch
        limit that saves makespan at the price of a session on time pays off when all
        instances finish near the makespan); returns the instances run under it."""
        if all(self.kinds[it.kind].batch_cap == 1 for it in insts):
            return insts
        saved = self.tradeoff
        options = []
        for rule in (None, "rate"):
            if rule == "rate":
                r = self.scenario(options[0][2])
                rule = r.makespan_s / max(1, r.on_time)
            self.tradeoff = rule
            trial = self.rerun(insts)
            options.append((self.score(trial), len(options), trial, rule))
        best = min(options, key=lambda o: o[:2])
        self.tradeoff = best[3] if math.isfinite(best[0]) else saved
        self.rule_of[id(best[2])] = self.tradeoff
        return best[2]

    def fits(self, inst_kind: int, sessions: list[int]) -> bool:
        k = self.kinds[inst_kind]
        c = self.cls[sessions]
        return bool(np.all(k.static + k.kv[:, c].sum(axis=1) <= self.mem))

    # ------------------------------------------------------------------ scoring
    def scenario(self, insts: list[Inst]):
        """The nominal :class:`~optimizer.deployment.evaluate.ScenarioResult` of ``insts``
        (same formulas as the evaluator)."""
        timings = []
        fake = []
        for n, it in enumerate(insts):
            if not it.sessions:
                continue
            iid = f"i{n}"
            fake.append(_Fake(iid, self.kinds[it.kind].gpus, ()))
            for i, f in zip(it.order, it.finish):
                s = self.sess[i]
                timings.append(SessionTiming(s.id, iid, 0.0, float(f), s.deadline_s))
        return scenario_from_timings(self.problem, Plan(fake), timings)

    def score(self, insts: list[Inst]) -> float:
        """The objective's value of ``insts``; inf when fewer sessions than required are on
        time, or, while :attr:`repairing`, SHORTFALL_PENALTY per missing session plus the
        makespan (s), so that a search can climb towards the requirement."""
        return self.value_of(self.scenario(insts))

    def value_of(self, r) -> float:
        """:meth:`score` of a plan's nominal :class:`~optimizer.deployment.evaluate.ScenarioResult`."""
        if r.on_time < self.need:
            return SHORTFALL_PENALTY * (self.need - r.on_time) + r.makespan_s if self.repairing else math.inf
        return self.obj.scenario_value(self.problem, r)

    # ------------------------------------------------------------------ construction
    def single_kind_mixes(self, gpus: Optional[int] = None) -> list[dict[int, int]]:
        """One kind on ``gpus`` GPUs (default: all), for every kind with at least one instance."""
        g = self.problem.total_gpus if gpus is None else gpus
        return [{k: g // kd.gpus} for k, kd in enumerate(self.kinds) if g // kd.gpus > 0]

    def round_mix(self, lp_mix: "LpMix", gpus: Optional[int] = None, keep: float = 1e-6) -> dict[int, int]:
        """The LP's instance counts rounded down to whole instances (kinds above ``keep``), the
        GPUs left (of ``gpus``, default all) filled one instance at a time by largest
        remainder; kinds with no instance dropped."""
        g = self.problem.total_gpus if gpus is None else gpus
        frac = {k: v for k, v in lp_mix.counts.items() if v > keep}
        mix = {k: int(math.floor(v + 1e-6)) for k, v in frac.items()}
        left = g - sum(self.kinds[k].gpus * n for k, n in mix.items())
        for k in sorted(frac, key=lambda k: -(frac[k] - mix[k])):
            if left >= self.kinds[k].gpus:
                mix[k] += 1
                left -= self.kinds[k].gpus
        return {k: n for k, n in mix.items() if n > 0}

    def mixes(self, lp_mix: Optional["LpMix"] = None) -> list[dict[int, int]]:
        """Instance counts per kind to try: one kind on all GPUs, two kinds sharing the GPUs in
        quarters, and the LP relaxation's counts rounded down (the rest filled greedily)."""
        G = self.problem.total_gpus
        K = range(len(self.kinds))
        out = [{k: G // self.kinds[k].gpus} for k in K]  # (kinds with no instance dropped below)
        for a in K:
            for b in K:
                if a == b:
                    continue
                for q in (1, 2, 3):
                    na = (G * q // 4) // self.kinds[a].gpus
                    nb = (G - na * self.kinds[a].gpus) // self.kinds[b].gpus
                    if a < b or q != 2:
                        out.append({a: na, b: nb})
        if lp_mix is not None:
            out.insert(0, self.round_mix(lp_mix, keep=1e-9))
        uniq = []
        for m in out:
            m = {k: n for k, n in m.items() if n > 0}
            if m and m not in uniq:
                uniq.append(m)
        # the LP's mix first, then by a fluid makespan estimate (when time runs short, the
        # promising mixes have been tried): max(longest session, Σ work / instances), each
        # session on its cheapest kind of the mix that fits it
        head = uniq[:1] if lp_mix is not None else []
        return head + sorted(uniq[len(head):], key=self._fluid_makespan)

    def _fluid_makespan(self, mix: dict[int, int]) -> float:
        """Fluid makespan estimate (s) of ``mix`` (see :meth:`mixes`); inf when a session fits none."""
        # per class, weighted by its sessions: identical sessions share a class (200,000 sessions
        # over thousands of mixes were minutes per session-array pass)
        counts = self._class_counts
        alone = np.full(len(counts), np.inf)
        work = np.full(len(counts), np.inf)
        for k in mix:
            kd = self.kinds[k]
            ok = kd.fits[:len(counts)]
            alone = np.where(ok, np.minimum(alone, kd.alone[:len(counts)]), alone)
            work = np.where(ok, np.minimum(work, kd.work[:len(counts)]), work)
        held = counts > 0
        if not np.all(np.isfinite(alone[held])):
            return math.inf
        return max(float(alone[held].max()), float((work[held] * counts[held]).sum()) / max(1, sum(mix.values())))

    @cached_property
    def _class_counts(self) -> np.ndarray:
        """Sessions per class (index = class index, as ``self.cls`` holds per session)."""
        return np.bincount(np.asarray(self.cls), minlength=len(self.problem.classes)).astype(float)

    def greedy(self, mix: dict[int, int], target: Optional[float] = None,
               prefer: Optional[np.ndarray] = None) -> Optional[list[Inst]]:
        """Earliest-deadline list scheduling on the instances of ``mix`` (see the module
        docstring); None when some session fits none of them.

        Without ``target`` each session goes where it finishes earliest. With a makespan target
        T (s) it goes, among the instances where it finishes by min(T, its deadline), to the one
        where it adds the fewest GPU·s (then the fullest: best fit); sessions that cannot be on
        time are placed after all others, where they add the fewest GPU·s within T (else finish
        earliest). Finish times are exact one session at a time, a proxy when batched
        (``w·steps + Σ KV reads``). ``prefer``: a kind per session (e.g. from the LP relaxation),
        tried first; the other kinds only when no instance of it has memory left."""
        kinds = list(mix)
        load = {k: np.zeros(mix[k]) for k in kinds}
        steps = {k: np.zeros(mix[k]) for k in kinds}
        nsum = {k: np.zeros(mix[k]) for k in kinds}
        kvw = {k: np.zeros(mix[k]) for k in kinds}
        mem = {k: np.tile(self.kinds[k].static, (mix[k], 1)) for k in kinds}
        members = {k: [[] for _ in range(mix[k])] for k in kinds}
        order = np.lexsort((np.arange(len(self.sess)), self.dl))
        late = []

        def proxy(k):
            kd = self.kinds[k]
            if kd.batch_cap == 1:
                return load[k]
            return kd.w_step * np.maximum(steps[k], np.ceil(nsum[k] / kd.batch_cap)) + kvw[k]

        def est(k, i):
            """(finish per instance with i added (inf: no memory), GPU·s added per instance)."""
            kd, c = self.kinds[k], self.cls[i]
            if not kd.fits[c]:
                return None
            ok = np.all(mem[k] + kd.kv[:, c] <= self.mem, axis=1)
            if not ok.any():
                return None
            if kd.batch_cap == 1:
                fin = load[k] + kd.alone[c]
            else:
                new = self.sess[i].new
                st = np.maximum(np.maximum(steps[k], new), np.ceil((nsum[k] + new) / kd.batch_cap))
                fin = np.maximum(kd.w_step * st + kvw[k] + kd.est[c], kd.alone[c])
            fin = np.where(ok, fin, np.inf)
            return fin, kd.gpus * (fin - proxy(k))

        def choose(i, limit, only=None):
            if prefer is not None and only is None and prefer[i] in mix:
                b = choose(i, limit, [int(prefer[i])])
                if b is not None:
                    return b
            best = None
            for k in (kinds if only is None else only):
                e = est(k, i)
                if e is None:
                    continue
                fin, add = e
                if limit is None:
                    j = int(np.argmin(fin))
                    key = (float(fin[j]),)
                else:
                    okj = fin <= limit
                    if not okj.any():
                        continue
                    cand = np.where(okj, add, np.inf)
                    m = cand.min()
                    js = np.nonzero(cand <= m * (1 + 1e-9))[0]
                    j = int(js[np.argmax(fin[js])])
                    key = (float(m), -float(fin[j]))
                if best is None or key < best[0]:
                    best = (key, k, j, float(fin[j]))
            return best

        def put(k, j, i):
            kd, c = self.kinds[k], self.cls[i]
            load[k][j] += kd.alone[c]
            steps[k][j] = max(steps[k][j], self.sess[i].new)
            nsum[k][j] += self.sess[i].new
            kvw[k][j] += kd.est[c]
            mem[k][j] += kd.kv[:, c]
            members[k][j].append(int(i))

        for n, i in enumerate(order):
            if self.stop_at is not None and n % 256 == 0 and time.perf_counter() >= self.stop_at:
                return None  # out of time (construct_many's hard deadline)
            if target is None:
                b = choose(i, None)
                if b is None:
                    return None
                if b[3] > self.dl[i] + EPS_S:
                    late.append(i)
                    continue
            else:
                b = choose(i, min(target, self.dl[i] + EPS_S))
                if b is None:
                    late.append(i)
                    continue
            put(b[1], b[2], i)
        for i in sorted(late, key=lambda i: -self.sess[i].new):
            b = choose(i, target) if target is not None else None
            if b is None:
                b = choose(i, None)
            if b is None:
                return None
            put(b[1], b[2], i)
        insts = [Inst(k, members[k][j]) for k in kinds for j in range(mix[k]) if members[k][j]]
        return [self.run(it) for it in insts]

    def pack(self, mix: dict[int, int], T: float, prefer: Optional[np.ndarray] = None,
             deadline: Optional[float] = None) -> Optional[list[Inst]]:
        """Bin packing of the sessions into the instances of ``mix`` under a makespan target
        ``T`` (s), as First Fit Decreasing with deadlines: sessions that must run early (deadline
        below twice their time on their kind) first in deadline order, then the rest by
        decreasing time (batched: by decreasing new tokens, so that sessions of similar length
        share the weight reads of their steps); each goes, on its kind (``prefer``, else the kind
        where it takes the fewest GPU·s) and then on the other kinds, to the instance where it
        adds the least time (then the fullest) among those where it fits the memory, keeps the
        load within T and (when it can be on time) keeps every on-time session of the instance
        on time in deadline order. One session at a time the load and deadline
        checks are exact; batched, the surrogate ``w·max new + Σ work`` (and
        ``w·new_s + Σ work·min(1, new_s/new_s')`` for a finish) of :mod:`optimizer.deployment.lns`
        is used. Sessions placed on time nowhere go, late, to the instance with the least load
        after them. None when a session fits no instance's memory (or at ``deadline``,
        a ``time.perf_counter()`` value)."""
        kinds = [k for k in mix if mix[k] > 0]
        if not kinds:
            return None
        S = len(self.sess)
        news = np.array([s.new for s in self.sess], dtype=np.float64)
        # per kind: arrays over its instances
        load = {k: np.zeros(mix[k]) for k in kinds}  # one at a time: Σ alone; batched: surrogate
        maxnew = {k: np.zeros(mix[k]) for k in kinds}
        worksum = {k: np.zeros(mix[k]) for k in kinds}
        mem = {k: np.tile(self.kinds[k].static, (mix[k], 1)) for k in kinds}
        members = {k: [[] for _ in range(mix[k])] for k in kinds}
        ontime = {k: [[] for _ in range(mix[k])] for k in kinds}

        def cost(k, i):
            kd = self.kinds[k]
            return kd.gpus * kd.alone[self.cls[i]] if kd.fits[self.cls[i]] else np.inf

        home = np.array([int(prefer[i]) if prefer is not None and prefer[i] in mix else
                         min(kinds, key=lambda k: cost(k, i)) for i in range(S)])
        size = np.array([self.kinds[home[i]].alone[self.cls[i]] for i in range(S)])
        if all(self.kinds[k].batch_cap == 1 for k in kinds):
            early = [i for i in range(S) if self.dl[i] < 2 * size[i]]
            early.sort(key=lambda i: (self.dl[i], -size[i]))
            rest = sorted(set(range(S)) - set(early), key=lambda i: -size[i])
        else:  # batched: longest decodes first, so that instances group sessions of similar length
            early, rest = [], sorted(range(S), key=lambda i: (-self.sess[i].new, -size[i], i))

        # batched surrogate finishes of each instance's on-time sessions, kept up to date by put()
        fin_on = {k: [np.zeros(0) for _ in range(mix[k])] for k in kinds}

        def batched_finishes(k, j, i):
            """(finishes of j's on-time sessions with i added, i's own finish), surrogate."""
            kd = self.kinds[k]
            on = ontime[k][j]
            wi = kd.est[self.cls[i]]
            others = fin_on[k][j] + wi * np.minimum(1.0, news[on] / news[i]) if on else fin_on[k][j]
            sess = members[k][j]
            own = kd.w_step * news[i] + wi
            if sess:
                own += float(np.sum(kd.est[self.cls[sess]] * np.minimum(1.0, news[i] / news[sess])))
            return others, own

        def on_time_ok(k, j, i) -> bool:
            """Every on-time session of instance j of kind k, with i added, meets its deadline."""
            kd = self.kinds[k]
            if kd.batch_cap == 1:
                o = sorted(ontime[k][j] + [i], key=lambda x: self.dl[x])
                fin = np.cumsum(kd.alone[self.cls[o]])
                return bool(np.all(fin <= self.dl[o] + EPS_S))
            others, own = batched_finishes(k, j, i)
            return own <= self.dl[i] + EPS_S and bool(np.all(others <= self.dl[ontime[k][j]] + EPS_S))

        def after(k, i):
            """(load of every instance of kind k with i added, memory fits) as arrays."""
            kd, c = self.kinds[k], self.cls[i]
            if kd.batch_cap == 1:
                ld = load[k] + kd.alone[c]
            else:
                ld = kd.w_step * np.maximum(maxnew[k], news[i]) + worksum[k] + kd.est[c]
            ok = np.all(mem[k] + kd.kv[:, c] <= self.mem, axis=1)
            return ld, ok

        def place(i, want_on: bool, limit: float):
            order = [home[i]] + sorted((k for k in kinds if k != home[i]), key=lambda k: cost(k, i))
            for k in order:
                kd, c = self.kinds[k], self.cls[i]
                if not kd.fits[c] or kd.alone[c] > limit or (want_on and kd.alone[c] > self.dl[i] + EPS_S):
                    continue
                ld, ok = after(k, i)
                ok &= ld <= limit * (1 + 1e-12)
                cand = np.nonzero(ok)[0]
                if not len(cand):
                    continue
                added = ld[cand] - load[k][cand]
                # the least added time, then the fullest (the first PACK_CANDIDATES of them)
                for j in cand[np.lexsort((-ld[cand], added))][:PACK_CANDIDATES]:
                    if not want_on or on_time_ok(k, int(j), i):
                        return k, int(j), float(ld[j])
            return None

        def put(k, j, i, ld, on):
            kd = self.kinds[k]
            if kd.batch_cap > 1:
                others, own = batched_finishes(k, j, i)
                fin_on[k][j] = np.append(others, own) if on else others
            members[k][j].append(i)
            if on:
                ontime[k][j].append(i)
            load[k][j] = ld
            maxnew[k][j] = max(maxnew[k][j], news[i])
            worksum[k][j] += kd.est[self.cls[i]]
            mem[k][j] = mem[k][j] + kd.kv[:, self.cls[i]]

        late = []
        for n, i in enumerate(early + rest):
            if deadline is not None and n % 64 == 0 and time.perf_counter() >= deadline:
                return None
            got = place(i, True, T)
            if got is None:
                late.append(i)
                continue
            put(*got[:2], i, got[2], True)
        for i in sorted(late, key=lambda i: -size[i]):
            got = place(i, False, T)
            if got is None:  # nothing within T: the least load after it
                best = None
                for k in kinds:
                    if not self.kinds[k].fits[self.cls[i]]:
                        continue
                    ld, ok = after(k, i)
                    if ok.any():
                        j = int(np.argmin(np.where(ok, ld, np.inf)))
                        if best is None or ld[j] < best[2]:
                            best = (k, j, float(ld[j]))
                if best is None:
                    return None
                got = best
            put(*got[:2], i, got[2], False)
        return [self.run(Inst(k, members[k][j])) for k in kinds for j in range(mix[k]) if members[k][j]]

    def construct(self, deadline: float, lp_mix=None, targets=(), hard: Optional[float] = None) -> Optional[list[Inst]]:
        """The best greedy plan over the mixes (and makespan ``targets``, s) tried before
        ``deadline`` (at least one; until ``hard`` while none meets the on-time requirement)."""
        ranked = self.construct_many(deadline, lp_mix, targets, hard)
        return ranked[0] if ranked else None

    def construct_many(self, deadline: float, lp_mix=None, targets=(), hard: Optional[float] = None) -> list[list[Inst]]:
        """Every greedy plan built before ``deadline`` (at least one when any exists; past it,
        until ``hard``, while none meets the on-time requirement), best first (starting points
        for :meth:`improve`; those short of the requirement after, fewest missing first)."""
        found = []
        best, best_v = None, math.inf
        prefer = lp_mix.prefer(self.problem) if lp_mix is not None else None
        self.tradeoff = None  # every greedy plan is run under both rules (choose_rule)
        self.stop_at = hard

        def keep(sol) -> None:  # a plan built: run it under its better rule, rank it
            nonlocal best, best_v
            sol = self.choose_rule(sol)
            r = self.scenario(sol)
            v = self.value_of(r)
            found.append((v, self.need - r.on_time if math.isinf(v) else 0, len(found), sol))
            if best is None or v < best_v:
                best, best_v = sol, v

        if len(self.sess) > DEAL_SESSIONS:  # a plan in linear time first: the greedy is O(sessions x instances)
            for mix in self.mixes(lp_mix)[:DEAL_MIXES]:
                if found and time.perf_counter() >= (deadline if math.isfinite(best_v) else (hard or deadline)):
                    break  # one dealt plan stands; more mixes only while time is left
                sol = self.deal(mix)
                if sol is not None:
                    keep(sol)
            if math.isfinite(best_v):  # a dealt plan stands: the greedy ones only until the soft deadline
                self.stop_at = deadline if hard is None else min(hard, deadline)
        for n, mix in enumerate(self.mixes(lp_mix)):
            pref = [prefer] if (prefer is not None and n == 0) else []
            for target, pr in [(None, p) for p in pref] + [(t, p) for p in pref for t in targets] + \
                    [(None, None)] + [(t, None) for t in targets]:
                now = time.perf_counter()
                if (now >= deadline and best is not None and (math.isfinite(best_v) or hard is None)) or \
                        (hard is not None and now >= hard):
                    self.stop_at = None
                    self.tradeoff = self.rule_of.get(id(best)) if best is not None else None
                    return [x for *_, x in sorted(found, key=lambda t: t[:3])]
                sol = self.greedy(mix, target, pr)
                if sol is not None:
                    keep(sol)
        self.stop_at = None
        if best is not None:
            self.tradeoff = self.rule_of.get(id(best))
        return [x for *_, x in sorted(found, key=lambda t: t[:3])]

    def deal(self, mix: dict[int, int]) -> Optional[list[Inst]]:
        """Sessions dealt out in deadline order to the instances of ``mix`` in turn (the next
        one whose kind fits the session and whose memory has room), each instance then run under
        the present batch limit rule: a plan in time linear in the sessions for inputs too large
        for :meth:`greedy`; None when a session fits no instance."""
        placed = self.place_in_turn(mix)
        return None if placed is None else [self.run(Inst(k, ss)) for k, ss in placed if ss]

    def place_in_turn(self, mix: dict[int, int], order: Optional[np.ndarray] = None,
                      partial: bool = False) -> Optional[list[tuple[int, list[int]]]]:
        """(kind, sessions) per instance of ``mix``: the sessions in ``order`` (default: deadline
        order) each go to the next instance in turn whose kind fits it and whose KV memory has
        room. A session that fits no instance ends the placement: None, or with ``partial`` the
        instances as they are (the sessions placed so far). Memory only, no timeline."""
        slots = [(k, j) for k in mix for j in range(mix[k])]
        if not slots:
            return None
        mem = [self.kinds[k].static.copy() for k, _ in slots]
        members: list[list[int]] = [[] for _ in slots]
        order = np.lexsort((np.arange(len(self.sess)), self.dl)) if order is None else order
        ptr = 0
        for n, i in enumerate(order):
            if self.stop_at is not None and n % 4096 == 0 and time.perf_counter() >= self.stop_at:
                return None  # out of time (construct_many's hard deadline)
            c = self.cls[i]
            for step in range(len(slots)):
                m = (ptr + step) % len(slots)
                kd = self.kinds[slots[m][0]]
                if kd.fits[c] and np.all(mem[m] + kd.kv[:, c] <= self.mem):
                    mem[m] += kd.kv[:, c]
                    members[m].append(int(i))
                    ptr = m + 1
                    break
            else:
                if not partial:
                    return None
                break
        return [(k, members[m]) for m, (k, _) in enumerate(slots)]

    def most_on_time(self, mix: dict[int, int], deadline: Optional[float] = None) -> Optional[list[Inst]]:
        """As many sessions on time as earliest-deadline best fit reaches on the instances of
        ``mix`` (one-at-a-time kinds only; None otherwise, or when a session fits no memory).

        Sessions in deadline order go on time to the instance where they finish latest without
        missing their deadline (best fit: the faster instances stay free for tighter deadlines);
        one that fits nowhere on time replaces, where that makes it on time, the longest on-time
        session of an instance that is longer than it (Moore and Hodgson's rule, 1968, on
        parallel instances: the same count, less load). Appending in deadline order keeps every
        instance's on-time sessions in Jackson order, so each stays on time; late sessions then
        go, longest first, to the instance with the least load after them. A plan for when list
        scheduling misses the on-time requirement (1,000 distinct generated sessions at 80 %:
        762 of 800 there, 804 here on the best mix). None also at ``deadline`` (a
        ``time.perf_counter()`` value)."""
        kinds = [k for k in mix if mix[k] > 0]
        if not kinds or any(self.kinds[k].batch_cap != 1 for k in kinds):
            return None
        load = {k: np.zeros(mix[k]) for k in kinds}
        mem = {k: np.tile(self.kinds[k].static, (mix[k], 1)) for k in kinds}
        members = {k: [[] for _ in range(mix[k])] for k in kinds}
        late = []

        def pick(c, d=None):
            """(kind, instance) where a session of class c finishes latest by ``d`` (on time),
            or, without ``d``, earliest; memory permitting; None when nowhere."""
            best = None
            for k in kinds:
                kd = self.kinds[k]
                if not kd.fits[c]:
                    continue
                fit = np.all(mem[k] + kd.kv[:, c] <= self.mem, axis=1)
                fin = np.where(fit, load[k] + kd.alone[c], np.inf)
                score = np.where(fin <= d, fin, -np.inf) if d is not None else -fin
                j = int(np.argmax(score))
                if np.isfinite(score[j]) and (best is None or score[j] > best[0]):
                    best = (score[j], k, j)
            return None if best is None else best[1:]

        def place(k, j, i):
            kd, c = self.kinds[k], self.cls[i]
            load[k][j] += kd.alone[c]
            mem[k][j] = mem[k][j] + kd.kv[:, c]
            members[k][j].append(i)

        def take(k, j, t):
            i = members[k][j].pop(t)
            kd, c = self.kinds[k], self.cls[i]
            load[k][j] -= kd.alone[c]
            mem[k][j] = mem[k][j] - kd.kv[:, c]
            return i

        def longest_exchange(c, d):
            """Moore-Hodgson: the (kind, instance, position) whose longest on-time session,
            longer than one of class c, it may take the place of and be on time by ``d`` (the
            most load saved), or None."""
            best = None
            for k in kinds:
                kd = self.kinds[k]
                if not kd.fits[c]:
                    continue
                for j in range(mix[k]):
                    if not members[k][j]:
                        continue
                    al = kd.alone[self.cls[members[k][j]]]
                    t = int(np.argmax(al))
                    out = self.cls[members[k][j][t]]
                    if al[t] <= kd.alone[c] or load[k][j] - al[t] + kd.alone[c] > d:
                        continue
                    if np.any(mem[k][j] - kd.kv[:, out] + kd.kv[:, c] > self.mem):
                        continue
                    if best is None or al[t] - kd.alone[c] > best[0]:
                        best = (al[t] - kd.alone[c], k, j, t)
            return None if best is None else best[1:]

        def past(n) -> bool:
            return deadline is not None and n % 64 == 0 and time.perf_counter() >= deadline

        for n, i in enumerate(np.lexsort((np.arange(len(self.sess)), self.dl))):
            if past(n):
                return None
            c, d = self.cls[i], self.dl[i] + EPS_S
            got = pick(c, d)
            if got is not None:
                place(*got, i)
                continue
            swap = longest_exchange(c, d)
            if swap is None:
                late.append(i)
                continue
            k, j, t = swap
            late.append(take(k, j, t))
            place(k, j, i)
        for n, i in enumerate(sorted(late, key=lambda i: -min(self.kinds[k].alone[self.cls[i]] for k in kinds))):
            if past(n):
                return None
            got = pick(self.cls[i])
            if got is None:
                return None
            place(*got, i)
        return [self.run(Inst(k, members[k][j])) for k in kinds for j in range(mix[k]) if members[k][j]]

    # ------------------------------------------------------------------ improvement
    def improve(self, insts: list[Inst], deadline: float, on_better=None) -> list[Inst]:
        """Moves and swaps out of the instance that finishes last (module docstring, step 2),
        after a rebalancing sweep (:meth:`rebalance`), which is tried again when they stall."""
        insts = [it for it in insts if it.sessions]
        cur = self.score(insts)
        got = self.rebalance(insts, cur, deadline)
        if got is not None:
            insts, cur = got
            if on_better is not None:
                on_better(insts, cur)
        balanced = True  # no move since the last sweep
        plateau = 0  # moves in a row that kept the value (several instances tie at the makespan)
        while time.perf_counter() < deadline:
            jmax = max(range(len(insts)), key=lambda j: insts[j].makespan)
            top = insts[jmax].makespan
            targets = sorted((j for j in range(len(insts)) if j != jmax), key=lambda j: insts[j].makespan)[:12]
            src = sorted(insts[jmax].sessions, key=lambda i: -self.kinds[insts[jmax].kind].alone[self.cls[i]])
            done = False
            for i in src:
                for j in targets:
                    if time.perf_counter() >= deadline:
                        return insts
                    for swap in [None] + sorted(insts[j].sessions, key=lambda t: self.kinds[insts[j].kind].alone[self.cls[t]])[:4]:
                        a = [s for s in insts[jmax].sessions if s != i] + ([swap] if swap is not None else [])
                        b = [s for s in insts[j].sessions if s != swap] + [i]
                        if not self.fits(insts[j].kind, b) or (swap is not None and not self.fits(insts[jmax].kind, a)):
                            continue
                        na = self.run(Inst(insts[jmax].kind, a)) if a else None
                        nb = self.run(Inst(insts[j].kind, b))
                        if nb.makespan >= top - 1e-12 or (na is not None and na.makespan >= top - 1e-12):
                            continue
                        trial = list(insts)
                        trial[j] = nb
                        if na is None:
                            trial.pop(jmax)
                        else:
                            trial[jmax] = na
                        v = self.score(trial)
                        if v <= cur * (1 + 1e-12) and (v < cur * (1 - 1e-12) or plateau <= len(insts)):
                            plateau = 0 if v < cur * (1 - 1e-12) else plateau + 1
                            insts, cur, done = trial, v, True
                            if on_better is not None:
                                on_better(insts, v)
                            break
                    if done:
                        break
                if done:
                    break
            if done:
                balanced = False
            if not done and not balanced:
                balanced = True
                got = self.rebalance(insts, cur, deadline)
                if got is not None:
                    insts, cur = got
                    if on_better is not None:
                        on_better(insts, cur)
                    continue
            if not done:
                plateau = 0
                merged = self._merge_widen(insts, jmax, cur)
                if merged is not None:
                    insts, cur = merged
                    if on_better is not None:
                        on_better(insts, cur)
                    continue
                done = self.rescue_late(insts, cur, deadline)
                if done is None:
                    break
                insts, cur = done
                if on_better is not None:
                    on_better(insts, cur)
        return insts

    def rebalance(self, insts: list[Inst], cur: float, deadline: float, rounds: int = REBALANCE_ROUNDS):
        """Sweeps that pair the instances finishing latest with those finishing earliest (one
        session at a time kinds only) and, per pair, move one session or swap two so that the
        later of the two finishes earlier, by more than the plan's makespan per on-time session
        for each on-time session the pair gives up (never below the on-time requirement).

        One at a time an instance's load is the sum of its sessions' times, so every move and
        swap of a pair is ranked arithmetically (numpy over |a| x (|b| + 1) candidates) and only
        the best ``REBALANCE_TRIES`` are simulated (:meth:`run`: on-time sessions by the search's
        admission order). :meth:`improve` moves out of the single latest instance, one at a time,
        and stalls when many instances tie near the makespan (5,000 requests on 256 instances
        spread 47-51.5 s); a sweep lowers all of them together. The plan is scored once per
        sweep. Returns (instances, value) when the objective improved, else None; stops at
        ``deadline`` (``time.perf_counter()``)."""
        seq = [j for j, it in enumerate(insts) if self.kinds[it.kind].batch_cap == 1 and it.sessions]
        if len(seq) < 2:
            return None
        best_insts, best_v = None, cur
        work = list(insts)
        r = self.scenario(work)
        rate = r.makespan_s / max(1, r.on_time)  # s of makespan one on-time session is worth
        spare = [r.on_time - self.need]  # on-time sessions the sweep may give up
        for _ in range(rounds):
            order = sorted(seq, key=lambda j: -work[j].makespan)
            half = len(order) // 2
            changed = False
            for a, b in zip(order[:half], reversed(order[half:])):
                if time.perf_counter() >= deadline:
                    break
                for _ in range(REBALANCE_PAIR_STEPS):
                    got = self._balance_pair(work[a], work[b], rate, spare)
                    if got is None:
                        break
                    work[a], work[b] = got
                    changed = True
            if not changed:
                break
            v = self.score(work)
            if v < best_v * (1 - 1e-12):
                best_insts, best_v = list(work), v
            if time.perf_counter() >= deadline:
                break
        return (best_insts, best_v) if best_insts is not None else None

    def _balance_pair(self, A: Inst, B: Inst, rate: float, spare: list):
        """The best move (a session of A to B) or swap (with a session of B) that lowers
        max(finish of A, finish of B) by more than ``rate`` (s) per on-time session the pair
        loses (at most ``spare[0]`` of them, which is then decreased: the plan keeps its
        on-time requirement) and fits memory: the two new instances, or None (see
        :meth:`rebalance`; ``rate`` is the plan's makespan per on-time session, the exchange
        rate of the batch limit rule)."""
        ka, kb = self.kinds[A.kind], self.kinds[B.kind]
        la, lb = A.makespan, B.makespan
        top = max(la, lb)
        sa = np.array(A.sessions)
        sb = np.array(B.sessions + [-1])  # -1: a move (no session comes back)
        ca, cb = self.cls[sa], self.cls[np.maximum(sb, 0)]
        if not np.any(kb.fits[ca]):
            return None
        x = ka.alone[ca][:, None]  # leaves A
        w = np.where(kb.fits[ca], kb.alone[ca], np.inf)[:, None]  # arrives on B
        back = sb >= 0
        y = np.where(back, np.where(ka.fits[cb], ka.alone[cb], np.inf), 0.0)[None, :]  # arrives on A
        u = np.where(back, kb.alone[cb], 0.0)[None, :]  # leaves B
        new_top = np.maximum(la - x + y, lb - u + w)
        if len(sa) == 1:
            new_top[:, -1] = np.inf  # A keeps at least one session (an empty instance is a merge)
        cand = np.argwhere(new_top < top * (1 - 1e-9))
        if not len(cand):
            return None
        on_before = int(np.sum(A.finish <= self.dl[A.order] + EPS_S)) + int(np.sum(B.finish <= self.dl[B.order] + EPS_S))
        ranked = cand[np.argsort(new_top[cand[:, 0], cand[:, 1]], kind="stable")][:REBALANCE_TRIES]
        for i, t in ranked:
            s_out, s_in = int(sa[i]), int(sb[t])
            na = [s for s in A.sessions if s != s_out] + ([s_in] if s_in >= 0 else [])
            nb = [s for s in B.sessions if s != s_in] + [s_out]
            if not self.fits(B.kind, nb) or (s_in >= 0 and not self.fits(A.kind, na)):
                continue
            ra, rb = self.run(Inst(A.kind, na)), self.run(Inst(B.kind, nb))
            on = int(np.sum(ra.finish <= self.dl[ra.order] + EPS_S)) + int(np.sum(rb.finish <= self.dl[rb.order] + EPS_S))
            lost = max(0, on_before - on)
            gain = top - max(ra.makespan, rb.makespan)
            if gain > top * 1e-9 and lost <= spare[0] and gain > rate * lost:
                spare[0] -= lost
                return ra, rb
        return None

    def _merge_widen(self, insts: list[Inst], jmax: int, cur: float):
        """Merge the instance that finishes last with the least-loaded instance of its kind into
        one instance of a kind with twice the GPUs (e.g. two TP4 into a TP8) when that improves
        the objective; (instances, value) or None."""
        k = insts[jmax].kind
        g = self.kinds[k].gpus
        wide = [n for n, kd in enumerate(self.kinds) if kd.gpus == 2 * g]
        mates = sorted((j for j in range(len(insts)) if j != jmax and insts[j].kind == k),
                       key=lambda j: insts[j].makespan)
        if not wide:
            return None
        free = self.problem.total_gpus - sum(self.kinds[it.kind].gpus for it in insts)
        options = [(None, insts[jmax].sessions)] if free >= g else []
        options += [(j, insts[jmax].sessions + insts[j].sessions) for j in mates[:3]]
        best = None
        for w in wide:
            for j, sess in options:
                if not self.fits(w, sess):
                    continue
                trial = [it for n, it in enumerate(insts) if n not in (jmax, j)] + [self.run(Inst(w, list(sess)))]
                v = self.score(trial)
                if v < cur * (1 - 1e-12) and (best is None or v < best[1]):
                    best = (trial, v)
        return best

    def rescue_late(self, insts: list[Inst], cur: float, deadline: float):
        """Move one late session to another instance (or swap it with one there) when that
        improves the objective; (instances, value) or None."""
        late = []
        for j, it in enumerate(insts):
            for i, f in zip(it.order, it.finish):
                if f > self.dl[i] + EPS_S:
                    late.append((self.dl[i], i, j))
        late.sort()
        order = sorted(range(len(insts)), key=lambda j: insts[j].makespan)
        tried_kinds = set()
        for _, i, src in late:  # a wider instance for a session no present kind serves on time
            c = self.cls[i]
            for w, kd in enumerate(self.kinds):
                if kd.alone[c] > self.dl[i] or (w, c) in tried_kinds or time.perf_counter() >= deadline:
                    continue
                tried_kinds.add((w, c))
                half = [j for j in order if j != src and self.kinds[insts[j].kind].gpus * 2 == kd.gpus]
                kinds_half = {insts[j].kind for j in half}
                for kh in kinds_half:
                    pair = [j for j in half if insts[j].kind == kh][:2]
                    if len(pair) < 2:
                        continue
                    sess = insts[pair[0]].sessions + insts[pair[1]].sessions + [i]
                    if not self.fits(w, sess):
                        continue
                    a = [s for s in insts[src].sessions if s != i]
                    trial = [it for n, it in enumerate(insts) if n not in (pair[0], pair[1], src)]
                    trial.append(self.run(Inst(w, sess)))
                    if a:
                        trial.append(self.run(Inst(insts[src].kind, a)))
                    v = self.score(trial)
                    if v < cur * (1 - 1e-12):
                        return trial, v
        for _, i, src in late:
            for j in order:
                if j == src:
                    continue
                if time.perf_counter() >= deadline:
                    return None
                for swap in [None] + insts[j].sessions[:6]:
                    a = [s for s in insts[src].sessions if s != i] + ([swap] if swap is not None else [])
                    b = [s for s in insts[j].sessions if s != swap] + [i]
                    if not self.fits(insts[j].kind, b) or (swap is not None and not self.fits(insts[src].kind, a)):
                        continue
                    trial = list(insts)
                    trial[j] = self.run(Inst(insts[j].kind, b))
                    if a:
                        trial[src] = self.run(Inst(insts[src].kind, a))
                    else:
                        trial.pop(src)
                    v = self.score(trial)
                    if v < cur * (1 - 1e-12):
                        return trial, v
        return None

    # ------------------------------------------------------------------ plan
    def plan(self, insts: list[Inst]) -> Plan:
        """Instances on servers (first-fit, spanning ones first)."""

        items = []
        for it in insts:
            if not it.sessions:
                continue
            k = self.kinds[it.kind]
            ids = [self.sess[i].id for i in it.order]
            if k.tp_plain:
                items.append((k.gpus, ids))
            else:
                items.append((k.gpus, ids, k.layout, it.batch))
        return pack_on_servers(self.problem, items)

    def from_classes(self, insts: list[tuple[int, np.ndarray]]) -> list[Inst]:
        """Instances given as (kind, sessions per class), the sessions of each class dealt out
        in order, each instance run under the present batch limit rule."""
        members: dict[int, list[int]] = {}
        for i, c in enumerate(self.cls):
            members.setdefault(int(c), []).append(i)
        ptr = {c: 0 for c in members}
        out = []
        for k, x in insts:
            ss = []
            for c, n in enumerate(x):
                n = int(n)
                if n:
                    ss += members[c][ptr[c]:ptr[c] + n]
                    ptr[c] += n
            out.append(self.run(Inst(k, ss)))
        return out

    def columns(self, insts: list[Inst]) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Each instance as (kind, sessions per class, of them on time per class)."""
        out = []
        C = len(self.problem.classes)
        for it in insts:
            if it.sessions:
                x = np.bincount(self.cls[it.sessions], minlength=C)
                on = np.asarray(it.finish) <= self.dl[it.order] + EPS_S
                y = np.bincount(self.cls[np.asarray(it.order)[on]], minlength=C) if on.any() else np.zeros(C, int)
                out.append((it.kind, x, y))
        return out

    def from_plan(self, plan: Plan) -> Optional[list[Inst]]:
        """Instances of an evaluated plan of this problem (e.g. from the rounded instance), re-run
        under this module's rules; None when a layout is not one of the kinds."""
        pos = {s.id: n for n, s in enumerate(self.sess)}
        out = []
        for pi in plan.instances:
            lay = pi.lay
            k = next((n for n, kd in enumerate(self.kinds) if kd.layout == lay), None)
            if k is None:
                return None
            out.append(self.run(Inst(k, [pos[s] for s in pi.sessions])))
        return out


class _Fake:
    """The two fields of a planned instance that :func:`scenario_from_timings` reads."""

    def __init__(self, iid: str, degree: int, servers: tuple):
        self.id, self.degree, self.servers = iid, degree, servers


# ---------------------------------------------------------------------------- bound
@dataclass
class LpMix:
    """An LP solution: instances per kind (fractional), sessions per (kind, LP class), and the
    LP class of every problem class."""

    counts: dict
    share: np.ndarray
    cmap: np.ndarray

    def prefer(self, problem: Problem) -> np.ndarray:
        """A kind per session: each LP class's sessions split over kinds by largest remainder
        of the LP shares, the longest sessions to the widest kinds."""
        out = np.zeros(len(problem.sessions), dtype=np.int64)
        by_lp: dict[int, list[int]] = {}
        for n, s in enumerate(problem.sessions):
            by_lp.setdefault(int(self.cmap[s.cls]), []).append(n)
        for l, idx in by_lp.items():
            f = self.share[:, l]
            tot = f.sum()
            if tot <= 0:
                continue
            want = f / tot * len(idx)
            cnt = np.floor(want).astype(int)
            for k in np.argsort(-(want - cnt))[: len(idx) - cnt.sum()]:
                cnt[k] += 1
            idx = sorted(idx, key=lambda n: -(problem.sessions[n].context + problem.sessions[n].new)
                         * problem.sessions[n].new)
            pos = 0
            for k in sorted(range(len(f)), key=lambda k: -k):
                out[idx[pos:pos + cnt[k]]] = k
                pos += cnt[k]
        return out


@dataclass
class _Grid:
    """Threshold grid of :meth:`BoundLP.cost_bound`: on-time requirement, top threshold (s),
    thresholds (s, ascending), LP values and mixes by threshold."""

    need: int
    hi: float
    pts: list
    vals: dict = field(default_factory=dict)
    mixes: dict = field(default_factory=dict)


DFF_ORDERS = (1, 2, 3, 4)
DFF_DEADLINE_STRIDE = 4  # every 4th deadline row also gets the dual-feasible cuts


def dff(q: int, x: float) -> float:
    """Fekete-Schepers dual feasible function u^(q) on [0, 1]: x when (q+1)·x is an integer,
    else floor((q+1)·x)/q; sizes summing to ≤ 1 keep images summing to ≤ 1 (Fekete and
    Schepers 2001). Sizes are shrunk by 1e-9 relative first, so floating-point noise can only
    lower an image; sizes > 1 (the item cannot be in the bin) map to 0 (no row term)."""
    if x > 1 + 1e-12:
        return 0.0
    x = x * (1 - 1e-9)
    y = (q + 1) * x
    if abs(y - round(y)) < 1e-12:
        return x
    return math.floor(y) / q


class BoundLP:
    """The LP relaxation of the module docstring (step 3), one HiGHS model per threshold."""

    def __init__(self, problem: Problem, perf, kinds: list[Kind]):
        self.problem = problem
        self.d = lp_params(problem, perf, kinds)
        self.solves = 0
        dls = np.unique(self.d.dl[np.isfinite(self.d.dl)])
        if len(dls) > DEADLINE_ROWS:
            dls = np.unique(dls[np.linspace(0, len(dls) - 1, DEADLINE_ROWS).round().astype(int)])
        self.dpoints = dls
        self.best_T: Optional[float] = None  # makespan (s) of the LP solution at the bound
        C = len(self.d.count)
        self.t_floor = float(np.max([min((kd[1][c] for kd in self.d.kinds if np.isfinite(kd[1][c])), default=np.inf)
                                     for c in range(C)]))
        # the makespan is at least the longest session alone on the fastest kind it fits: taken
        # from the real classes (the LP's relaxed classes round lengths down)
        alone = np.array([np.where(k.fits, k.alone, np.inf) for k in kinds])
        if alone.size:
            self.t_floor = max(self.t_floor, float(np.max(np.min(alone, axis=0))))
        news = np.unique(self.d.new)
        mn = float(news.min()) if len(news) else 0.0
        news = news[news > mn]
        if len(news) > STAIRCASE_STEPS:
            news = np.unique(news[np.linspace(0, len(news) - 1, STAIRCASE_STEPS).round().astype(int)])
        self.steps = [float(v) for v in news]  # decode-step thresholds of the batched staircase
        # and at least the GPU time every session takes on the cheapest kind it fits, over the
        # GPUs: from the real classes too (with more than LP_MAX_CLASSES classes the relaxed
        # instance's rounded-down lengths lose up to the grid step: on the 5,000 Azure requests
        # one session at a time the floor is 48.3 s on the real lengths, 41.3 s on the rounded)
        G = problem.total_gpus
        self.gpu_s_floor = math.inf  # GPU·s every plan's instances spend at least (s)
        if kinds:
            new = np.array([c.new for c in problem.classes], dtype=float)
            gpu_s = np.min([np.where(k.fits, k.gpus * step_split(k, new)[0], np.inf) for k in kinds], axis=0)
            counts = np.array([c.count for c in problem.classes], dtype=float)
            if np.all(np.isfinite(gpu_s)):
                self.gpu_s_floor = float(np.sum(counts * gpu_s))
                self.t_floor = max(self.t_floor, self.gpu_s_floor / G)
        work = sum(self.d.count[c] * min(kd[0] * kd[2][c] for kd in self.d.kinds) for c in range(C))
        self.t_floor = max(self.t_floor, work / G)
        from optimizer.deployment.colgen import ConfigLP

        self.cg = ConfigLP.for_problem(problem, kinds)  # None beyond CG_MAX_CLASSES classes
        self._cg_done: set = set()  # thresholds the configuration LP has bounded
        self._grid: Optional[_Grid] = None  # set by cost_bound
        self._span: Optional[tuple[int, float, float]] = None  # (need, lo, hi) of makespan_bound

    def max_on_time(self, T: float, gpus: Optional[int] = None) -> tuple[float, Optional[dict[int, float]]]:
        """LP maximum of on-time sessions with makespan ≤ T (−1 if infeasible), and the
        instance counts per kind of the LP solution. ``T = inf``: no makespan limit (memory,
        deadlines and GPUs only); ``gpus``: GPUs the instances may use (default: all). An LP
        that HiGHS ends neither optimal nor
        infeasible is solved again without presolve, then by the interior-point method; if it
        still ends unknown, every session counts as on time (the bound stays valid)."""
        import highspy

        from optimizer.highs import new_highs, single_thread

        d = self.d
        C, K = len(d.count), len(d.kinds)
        cost = []
        entries: list[tuple[int, int, float]] = []  # (row, col, value)
        row_lo, row_hi = [], []
        col = 0
        ycol, zcol = {}, {}
        for k, (g, alone, work, w, room, kv, mn, dp, seq) in enumerate(d.kinds):
            for c in range(C):
                ok = alone[c] <= T * (1 + 1e-12) and np.all(kv[:, c] <= room + 1e-6)
                if not ok:
                    continue
                if alone[c] <= d.dl[c] * (1 + 1e-12):
                    ycol[k, c] = col; col += 1; cost.append(-1.0)
                zcol[k, c] = col; col += 1; cost.append(0.0)
        ncol = {}
        for k in range(K):
            ncol[k] = col; col += 1; cost.append(0.0)
        # staircase of batched kinds: m[k, i] instances of kind k whose longest session decodes
        # at least STEPS[i] tokens (each such instance reads its weights on at least that many steps)
        mcol = {}
        for k, kd in enumerate(d.kinds):
            if kd[3] > 0:
                for i in range(len(self.steps)):
                    mcol[k, i] = col; col += 1; cost.append(0.0)
        r = 0
        for c in range(C):  # assignment
            for k in range(K):
                for m in (ycol, zcol):
                    if (k, c) in m:
                        entries.append((r, m[k, c], 1.0))
            row_lo.append(d.count[c]); row_hi.append(d.count[c]); r += 1
        for k in range(K):  # gpus
            entries.append((r, ncol[k], float(d.kinds[k][0])))
        row_lo.append(-np.inf); row_hi.append(float(self.problem.total_gpus if gpus is None else gpus)); r += 1
        timed = math.isfinite(T)
        for k, (g, alone, work, w, room, kv, mn, dp, seq) in enumerate(d.kinds):
            for s in range(kv.shape[0]):  # memory per stage
                for c in range(C):
                    for m in (ycol, zcol):
                        if (k, c) in m and kv[s, c] > 0:
                            entries.append((r, m[k, c], float(kv[s, c])))
                entries.append((r, ncol[k], -float(room[s])))
                row_lo.append(-np.inf); row_hi.append(0.0); r += 1
            for c in range(C) if timed else ():  # time
                for m in (ycol, zcol):
                    if (k, c) in m:
                        entries.append((r, m[k, c], float(work[c])))
            if timed:
                entries.append((r, ncol[k], w * mn - T))
                prev = mn
                for i, nu in enumerate(self.steps if w > 0 else ()):  # + w·Σ_i (ν_i − ν_{i−1})·m_i
                    entries.append((r, mcol[k, i], w * (nu - prev)))
                    prev = nu
                row_lo.append(-np.inf); row_hi.append(0.0); r += 1
            for i, nu in enumerate(self.steps if w > 0 and timed else ()):
                # the m_i instances that decode ≥ ν_i tokens carry every session with new_c ≥ ν_i
                # and read their weights on Σ of their decode lengths ≥ ν_i·m_i + Σ_{j>i}
                # (ν_j − ν_{j−1})·m_j steps: Σ_{new_c ≥ ν} work_c·x_kc + w·(that) ≤ m_i·T;
                # Σ_{new_c ≥ ν} kv_c·x_kc ≤ m_i·room (per stage); m_i ≤ m_{i−1} ≤ n_k
                for c in range(C):
                    if d.new[c] >= nu:
                        for m in (ycol, zcol):
                            if (k, c) in m:
                                entries.append((r, m[k, c], float(work[c])))
                entries.append((r, mcol[k, i], -(T - w * nu)))
                for j in range(i + 1, len(self.steps)):
                    entries.append((r, mcol[k, j], w * (self.steps[j] - self.steps[j - 1])))
                row_lo.append(-np.inf); row_hi.append(0.0); r += 1
                for s_ in range(kv.shape[0]):
                    for c in range(C):
                        if d.new[c] >= nu and kv[s_, c] > 0:
                            for m in (ycol, zcol):
                                if (k, c) in m:
                                    entries.append((r, m[k, c], float(kv[s_, c])))
                    entries.append((r, mcol[k, i], -float(room[s_])))
                    row_lo.append(-np.inf); row_hi.append(0.0); r += 1
                entries.append((r, mcol[k, i], 1.0))
                entries.append((r, mcol[k, i - 1] if i else ncol[k], -1.0))
                row_lo.append(-np.inf); row_hi.append(0.0); r += 1
            # dual-feasible-function cuts (Fekete-Schepers u^(q)): per bin Σ size ≤ 1 implies
            # Σ u^(q)(size) ≤ 1; bins: instances (time, one at a time) and DP ranks (memory)
            for q in DFF_ORDERS:
                if seq:
                    if timed:
                        sizes = [(c, alone[c] / T) for c in range(C)]
                        self._dff_row(entries, row_lo, row_hi, r, q, sizes, ycol, zcol, k, ncol[k], 1.0)
                        r += 1
                    for dv in self.dpoints[self.dpoints < T][::DFF_DEADLINE_STRIDE]:
                        sizes = [(c, work[c] / dv) for c in range(C) if d.dl[c] <= dv]
                        self._dff_row(entries, row_lo, row_hi, r, q, sizes, ycol, None, k, ncol[k], 1.0)
                        r += 1
                for s_ in range(kv.shape[0]):
                    if room[s_] <= 0:
                        continue
                    sizes = [(c, kv[s_, c] * dp / room[s_]) for c in range(C)]
                    self._dff_row(entries, row_lo, row_hi, r, q, sizes, ycol, zcol, k, ncol[k], float(dp))
                    r += 1
            for dv in self.dpoints:  # EDD prefix rows
                if dv >= T:
                    break
                for c in range(C):
                    if (k, c) in ycol and d.dl[c] <= dv:
                        entries.append((r, ycol[k, c], float(work[c])))
                entries.append((r, ncol[k], -float(dv)))
                row_lo.append(-np.inf); row_hi.append(0.0); r += 1
        lp = highspy.HighsLp()
        lp.num_col_ = col
        lp.num_row_ = r
        lp.col_cost_ = np.array(cost)
        lp.col_lower_ = np.zeros(col)
        ub = np.full(col, np.inf)
        for (k, c), j in list(ycol.items()) + list(zcol.items()):
            ub[j] = d.count[c]
        lp.col_upper_ = ub
        lp.row_lower_ = np.array(row_lo)
        lp.row_upper_ = np.array(row_hi)
        e = np.array(entries, dtype=float).reshape(-1, 3)
        order = np.lexsort((e[:, 0], e[:, 1]))
        e = e[order]
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(e[:, 1], np.arange(col + 1)).astype(np.int32)
        lp.a_matrix_.index_ = e[:, 0].astype(np.int32)
        lp.a_matrix_.value_ = e[:, 2]
        h = new_highs()
        single_thread(h)
        h.passModel(lp)
        h.run()
        self.solves += 1
        st = h.getModelStatus()
        done = (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible)
        for option, value in LP_RETRIES:  # HiGHS sometimes ends "unknown": solve again another way
            if st in done:
                break
            h.clearSolver()
            h.setOptionValue(option, value)
            h.run()
            self.solves += 1
            st = h.getModelStatus()
        if st == highspy.HighsModelStatus.kInfeasible:
            return -1.0, None
        if st != highspy.HighsModelStatus.kOptimal:
            return float(d.count.sum()), None  # unknown: assume everything (keeps the bound valid)
        x = np.array(h.getSolution().col_value)
        share = np.zeros((K, C))
        for (k, c), j in list(ycol.items()) + list(zcol.items()):
            share[k, c] += x[j]
        self.last_share = share
        mix = LpMix({k: float(x[ncol[k]]) for k in range(K)}, share, self.d.cmap)
        return float(-h.getInfo().objective_function_value), mix

    @staticmethod
    def _dff_row(entries, row_lo, row_hi, r, q, sizes, ycol, zcol, k, ncol_k, per_instance) -> None:
        """Row ``Σ u^(q)(size_c)·x_kc ≤ per_instance·n_k`` (``zcol`` None: on-time columns only)."""
        for c, x in sizes:
            f = dff(q, x)
            if f <= 0:
                continue
            for m in (ycol, zcol):
                if m is not None and (k, c) in m:
                    entries.append((r, m[k, c], f))
        entries.append((r, ncol_k, -per_instance))
        row_lo.append(-np.inf)
        row_hi.append(0.0)

    def min_gpus(self, need: int, deadline: float) -> Optional[int]:
        """Fewest GPUs in instances with which the LP reaches ``need`` on-time sessions at any
        makespan (memory, deadlines and the on-time count bind; a bound of the ``gpus``
        objective), by bisection on the GPU row (at ``deadline``, the smallest count not yet
        ruled out); None when the LP misses ``need`` even with every GPU of the servers."""
        lo, hi = 0, self.problem.total_gpus  # LP(lo) < need ≤ LP(hi)
        if self.max_on_time(math.inf, hi)[0] < need - 1e-6:
            return None
        while hi - lo > 1:
            if time.perf_counter() >= deadline:
                return lo + 1
            mid = (lo + hi) // 2
            if self.max_on_time(math.inf, mid)[0] >= need - 1e-6:
                hi = mid
            else:
                lo = mid
        return hi

    def gpu_time_bound(self) -> Optional[float]:
        """GPU·s per on-time session (s) below which no plan bills (a bound of the ``dollars``
        objective before its price): every session's GPU time on the kind where it is least
        (one at a time its service time, batched its KV reads, times the kind's GPUs), over
        the LP's most on-time sessions at any makespan; None when a session fits no kind."""
        if not math.isfinite(self.gpu_s_floor):
            return None
        v = self.max_on_time(math.inf)[0]
        return None if v <= 0 else self.gpu_s_floor / v

    def cost_bound(self, need: int, t_hi: float, deadline: float) -> tuple[Optional[float], Optional[dict]]:
        """Lower bound (s·GPUs per on-time session) of ``G·M/v`` over plans with ≥ ``need`` on
        time, given that plans with ``M ≥ t_hi`` cannot beat the incumbent (``t_hi`` =
        incumbent cost·N/G); and the LP mix at the best interval. The grid and values are kept
        for :meth:`refine_cost_bound`."""
        G, N = self.problem.total_gpus, float(self.d.count.sum())
        lo = self.t_floor
        if not math.isfinite(lo) or lo <= 0:
            return None, None
        hi = max(t_hi, lo * 1.0001)
        self._grid = _Grid(need, hi, list(np.geomspace(lo, hi, 24)))
        pts = self._grid.pts
        for _ in range(200):
            if time.perf_counter() >= deadline:
                break
            i = int(np.argmin(self._intervals(deadline)))
            if pts[i + 1] / pts[i] < 1.0005:
                break
            pts.insert(i + 1, math.sqrt(pts[i] * pts[i + 1]))
        return self._grid_bound()

    def _v(self, T: float, deadline: float) -> float:
        """The LP's on-time maximum at T (cached on the grid; N when not evaluated in time)."""
        g = self._grid
        if T not in g.vals:
            if time.perf_counter() >= deadline:
                return float(self.d.count.sum())  # not evaluated in time: a valid, weak value
            g.vals[T], g.mixes[T] = self.max_on_time(T)
            self._monotone()
        return g.vals[T]

    def _monotone(self) -> None:
        """v(T) never falls as T grows: every evaluated value is capped by those above it."""
        vals = self._grid.vals
        low = math.inf
        for t in sorted(vals, reverse=True):
            low = min(low, vals[t])
            vals[t] = low

    def _intervals(self, deadline: float) -> list[float]:
        """``G·T_i / v(T_{i+1})`` on every interval of the grid (inf where v < need)."""
        pts = self._grid.pts
        return [self._interval(i, self._v(pts[i + 1], deadline)) for i in range(len(pts) - 1)]

    def _interval(self, i: int, vb: float) -> float:
        """``G·T_i / v`` for v = v(T_{i+1}) (inf when v misses the requirement)."""
        g = self._grid
        return math.inf if vb < g.need - 1e-6 else self.problem.total_gpus * g.pts[i] / max(vb, 1e-12)

    def _grid_bound(self) -> tuple[float, Optional[dict]]:
        """The cost bound of the grid as it stands (unevaluated points count every session on
        time), and the LP mix at its best interval."""
        g = self._grid
        G, N = self.problem.total_gpus, float(self.d.count.sum())
        best, mix = G * g.hi / N, None
        for i in range(len(g.pts) - 1):
            if g.pts[i + 1] not in g.vals:
                b = G * g.pts[i] / N  # any v ≤ N
            else:
                b = self._interval(i, g.vals[g.pts[i + 1]])
                if b < best:
                    mix = g.mixes.get(g.pts[i + 1])
                    self.best_T = g.pts[i + 1]
            best = min(best, b)
        return best * (1 - 1e-7), mix

    def refine_cost_bound(self, deadline: float) -> Optional[float]:
        """The cost bound of :meth:`cost_bound` tightened by the configuration LP
        (:class:`~optimizer.deployment.colgen.ConfigLP`, at most CG_MAX_CLASSES classes) at the
        grid points that decide it, until ``deadline``; None when it does not apply (or
        cost_bound has not run)."""
        if self.cg is None or self._grid is None:
            return None
        pts, vals = self._grid.pts, self._grid.vals
        while time.perf_counter() < deadline:
            bounds = self._intervals(deadline)
            i = int(np.argmin(bounds))
            if not math.isfinite(bounds[i]):
                break
            b = pts[i + 1]
            if b not in self._cg_done:
                u = self.cg.upper(b, deadline)
                if u is None:
                    break
                self._cg_done.add(b)
                vals[b] = min(vals[b], u)
                self._monotone()
                continue
            if pts[i + 1] / pts[i] < 1.0005:
                break
            pts.insert(i + 1, math.sqrt(pts[i] * pts[i + 1]))
        return self._grid_bound()[0]

    def makespan_bound(self, need: int, t_hi: float, deadline: float) -> tuple[Optional[float], Optional[dict]]:
        """Largest T (s) at which the LP cannot reach ``need`` on time (makespan > T), by
        bisection between the floor and ``t_hi``; and the LP mix at the upper end."""
        lo = self.t_floor
        if not math.isfinite(lo):
            return None, None
        if self.max_on_time(lo)[0] >= need - 1e-6:
            return lo * (1 - 1e-9), None
        hi, mix = t_hi, None
        vh, mh = self.max_on_time(hi)
        if vh < need - 1e-6:
            return hi * (1 - 1e-9), None
        mix = mh
        while hi / lo > 1.0002 and time.perf_counter() < deadline:
            mid = math.sqrt(lo * hi)
            vm, mm = self.max_on_time(mid)
            if vm >= need - 1e-6:
                hi, mix = mid, mm
            else:
                lo = mid
        self.best_T = hi
        self._span = (need, lo, t_hi)
        return lo * (1 - 1e-9), mix

    def refine_makespan_bound(self, deadline: float) -> Optional[float]:
        """The makespan bound of :meth:`makespan_bound` raised by the configuration LP: the
        largest T (bisection up to the incumbent's makespan) at which its bound on the on-time
        sessions stays below the requirement; None when it does not apply."""
        if self.cg is None or self._span is None:
            return None
        need, lo, hi = self._span
        while hi / lo > 1.0002 and time.perf_counter() < deadline:
            mid = math.sqrt(lo * hi)
            u = self.cg.upper(mid, deadline)
            if u is None:
                break
            if u < need - 1e-6:
                lo = mid
            else:
                hi = mid
                self.best_T = mid
        self._span = (need, lo, hi)
        return lo * (1 - 1e-9)


def bound_in_unit(problem: Problem, objective, lp: BoundLP, incumbent, deadline: float):
    """The LP bound in the objective's unit (cost, makespan and energy by their threshold
    searches; by ``objective.lp_bound`` otherwise: ``"gpus"`` by :meth:`BoundLP.min_gpus`,
    ``"gpu_time"`` (dollars) by :meth:`BoundLP.gpu_time_bound`; None for the others, e.g.
    latency), and the LP's instance mix (None for the ``lp_bound`` ones). ``incumbent``: the incumbent's nominal
    :class:`~optimizer.deployment.evaluate.ScenarioResult` (or None): plans whose makespan
    makes them worse than it need not be bounded."""
    need = max(problem.required_on_time, objective.min_on_time)
    N, G = len(problem.sessions), problem.total_gpus
    if objective.search == "cost":
        ok = incumbent is not None and math.isfinite(incumbent.cost_gpu_s)
        t_hi = incumbent.cost_gpu_s * N / G if ok else lp.t_floor * 4
        b, mix = lp.cost_bound(max(need, 1), t_hi, deadline)
    elif objective.search == "makespan":
        t_hi = incumbent.makespan_s if incumbent is not None else lp.t_floor * 4
        b, mix = lp.makespan_bound(need, t_hi, deadline)
    elif objective.lp_bound == "gpus":
        g = lp.min_gpus(need, deadline)
        return (None if g is None else float(g)), None
    elif objective.lp_bound == "gpu_time":
        b = lp.gpu_time_bound()
        return (None if b is None else objective.ratio_in_unit(problem, Fraction(b / TIME_UNIT_S)) * (1 - 1e-9)), None
    else:
        return None, None
    return _in_unit(problem, objective, b), mix


def _in_unit(problem: Problem, objective, b: Optional[float]):
    """A bound in seconds (makespan search) or GPU·s per on-time session (cost search) in the
    objective's unit; None for None or inf."""
    if b is None or not math.isfinite(b):
        return None
    if objective.search == "cost":
        return objective.ratio_in_unit(problem, Fraction(b / TIME_UNIT_S))
    return objective.bound_in_unit(problem, math.floor(b / TIME_UNIT_S))


def refined_bound_in_unit(problem: Problem, objective, lp: BoundLP, deadline: float):
    """The bound of :func:`bound_in_unit` tightened by the configuration LP
    (:meth:`BoundLP.refine_cost_bound`, :meth:`BoundLP.refine_makespan_bound`), in the
    objective's unit; None when it does not apply or reached nothing before ``deadline``."""
    if objective.search == "cost":
        return _in_unit(problem, objective, lp.refine_cost_bound(deadline))
    if objective.search == "makespan":
        return _in_unit(problem, objective, lp.refine_makespan_bound(deadline))
    return None


# ---------------------------------------------------------------------------- aggregation
def rounded_problem(problem: Problem, levels: tuple[int, int, int]) -> Problem:
    """A rounded instance with at most ``levels`` = (contexts, new tokens, deadlines) distinct
    values: contexts and new tokens rounded up to quantiles of their values (the largest value
    is a grid point), deadlines down (the smallest is a grid point). Session ids are kept, so a
    plan of it is a plan of ``problem``; one that meets the memory and deadlines of the rounded
    instance meets them in ``problem`` (longer sessions only take longer and hold more KV)."""
    ss = problem.sessions

    def grid(vals, k, top):
        u = np.unique(np.asarray(vals, dtype=float))
        if len(u) <= k:
            return u
        q = np.quantile(u, np.linspace(0, 1, k + 1)[1:] if top else np.linspace(0, 1, k + 1)[:-1], method="nearest")
        return np.unique(q)

    gc = grid([s.context for s in ss], levels[0], True)
    gn = grid([s.new for s in ss], levels[1], True)
    dls = [s.deadline_s for s in ss if s.deadline_s is not None]
    gd = grid(dls, levels[2], False) if dls else np.zeros(0)

    def up(g, x):
        return int(g[np.searchsorted(g, x - 1e-9)])

    def down(g, x):
        return float(g[np.searchsorted(g, x + 1e-12, side="right") - 1])

    keys: dict[tuple, list[str]] = {}
    new_sessions = []
    for s in ss:
        key = (up(gc, s.context), up(gn, s.new), None if s.deadline_s is None else down(gd, s.deadline_s))
        keys.setdefault(key, []).append(s.id)
    index = {k: i for i, k in enumerate(keys)}
    for s in ss:
        key = (up(gc, s.context), up(gn, s.new), None if s.deadline_s is None else down(gd, s.deadline_s))
        new_sessions.append(replace(s, context=key[0], new=key[1], deadline_s=key[2], cls=index[key]))
    classes = tuple(SessionClass(i, k[0], k[1], k[2], tuple(ids)) for i, (k, ids) in enumerate(keys.items()))
    return replace(problem, sessions=tuple(new_sessions), classes=classes)

