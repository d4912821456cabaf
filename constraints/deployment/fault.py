"""Fault robustness (sequence mode): one scenario per (fault, instance it can hit).

Fault model (issue #2): at ``at`` the instance holding the failed GPU stalls until
``at + stall``; the session running at ``at`` restarts from its first step when the stall
ends; later sessions follow. Sessions that finished by ``at`` are unaffected.

For slot k, with finish times ``F_r`` of its positions (counted from the end of the run,
r = 0 last; no idle time; unused positions have F = 0):
  * ``b_r ⇔ F_r > at`` (position r is affected; b is non-increasing in r);
  * ``u`` = start of the first affected session = ``F_{r+1}`` where ``b_r ∧ ¬b_{r+1}``;
  * an affected session finishes at ``F_r + stall + at − u``.
A fault without ``gpu`` may hit any GPU: the plan must meet the on-time fraction in every
scenario and the objective is the worst case (scenarios of unused slots equal the nominal
run). A fault naming a GPU hits the instance the solver places on that GPU (``holds``
literals), or nothing if the solver leaves that GPU idle.

The restart dynamics are physics, not limits, so they are unnamed; the user-level limits
of each scenario are ``on_time[scenario]`` (see :mod:`constraints.deployment.on_time`).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

from constraints.deployment.deadline import position_deadline
from optimizer.deployment.units import Scenario, ticks_down, ticks_up


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    faults = f.problem.faults
    if not faults:
        return
    if f.mode != "sequence":
        raise ValueError("faults need the sequence formulation")
    m = f.model
    G = f.problem.server.gpus
    named = sorted({flt.gpu for flt in faults if flt.gpu is not None})
    f.holds = {}  # (gpu, slot index) -> literal
    f.idle = {}  # gpu -> literal
    for g in named:
        s = g // G
        lits = []
        for k in f.slots_on_server(s):
            v = m.new_bool_var(f"holds[gpu {g},{k.label}]")
            m.add(v <= f.used[k.index])
            f.holds[g, k.index] = v
            lits.append(v)
        idle = m.new_bool_var(f"idle[gpu {g}]")
        f.idle[g] = idle
        m.add(sum(lits) + idle == 1)
    for s in sorted({g // G for g in named}):
        gs = [g for g in named if g // G == s]
        ks = f.slots_on_server(s)
        for k in ks:
            m.add(sum(f.holds[g, k.index] for g in gs) <= k.gpus_each)
        m.add(sum(f.idle[g] for g in gs) + sum(k.gpus_each * f.used[k.index] for k in ks) <= G)

    for fi, flt in enumerate(faults):
        a = ticks_down(flt.at_s)
        st = ticks_up(flt.stall_s)
        slots = f.slots if flt.gpu is None else f.slots_on_server(flt.gpu // G)
        for k in slots:
            Q = f.Q[k.index]
            if Q == 0:
                continue
            tag = f"fault{fi}@{k.label}" if flt.gpu is None else f"fault{fi} gpu {flt.gpu}@{k.label}"
            # positions count from the end of the run (0 = last); unused ones have F = 0
            b = [m.new_bool_var(f"b[{tag},{r}]") for r in range(Q)]
            u = m.new_int_var(0, a, f"u[{tag}]")
            o2, c2 = [], []
            for r in range(Q):
                F = f.F[k.index, r]
                m.add(F >= a + 1).only_enforce_if(b[r])
                m.add(F <= a).only_enforce_if(~b[r])
                start = f.F[k.index, r + 1] if r + 1 < Q else 0  # the position before r ends when r starts
                if r + 1 < Q:
                    m.add(b[r] >= b[r + 1])
                    m.add(u == start).only_enforce_if([b[r], ~b[r + 1]])
                else:
                    m.add(u == 0).only_enforce_if(b[r])
                d = position_deadline(f, k, r)
                ov = m.new_bool_var(f"o2[{tag},{r}]")
                m.add(ov <= f.filled[k.index, r])
                m.add(F + st + a - u <= d).only_enforce_if([ov, b[r]])
                m.add(F <= d).only_enforce_if([ov, ~b[r]])
                o2.append(ov)
                if f.latency:
                    cv = m.new_int_var(0, f.horizon, f"C2[{tag},{r}]")
                    m.add(cv == F + st + a - u).only_enforce_if(b[r])
                    m.add(cv == F).only_enforce_if(~b[r])
                    c2.append(cv)
            wp = m.new_int_var(0, f.horizon, f"Wf[{tag}]")
            m.add(wp == f.W[k.index] + st + a - u).only_enforce_if(b[0])
            m.add(wp == f.W[k.index]).only_enforce_if(~b[0])
            own_on = sum(f.o[k.index, r] for r in range(Q))
            on = f.on_time_total - own_on + sum(o2)
            fsum = None
            if f.latency:
                fsum = f.finish_sum() - sum(f.F[k.index, r] for r in range(Q)) + sum(c2)
            enforce = [] if flt.gpu is None else [f.holds[flt.gpu, k.index]]
            f.scenarios.append(Scenario(tag, [f.M, wp], on, fsum, enforce))


def describe(key: ConstraintKey, f) -> str:
    return str(key)
