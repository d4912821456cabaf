"""Objective ``cost`` (GPU·s per on-time session): all GPUs of all servers are billed from
t=0 until the last session finishes, divided by the sessions that finish on time; with
faults, the worst case over the scenarios: ``max_s G·M_s / on_s``.

The ratio is solved exactly with Dinkelbach's method (generalised to a max of ratios,
Crouzeix-Ferland-Schaible 1985): for λ = num/den, minimise
``Z ≥ den·G·M_s − num·on_s`` over every scenario s and makespan term; if the optimum is
≥ 0, λ is optimal, otherwise the new plan has a smaller ratio and becomes the next λ.
"""
from __future__ import annotations

from fractions import Fraction

NAME = "cost"
UNIT = "GPU·s per on-time session"


def apply(f, lam: Fraction) -> None:
    g = f.problem.total_gpus
    num, den = lam.numerator, lam.denominator
    big = den * g * f.horizon + num * max(1, f.n_sessions)
    z = f.model.new_int_var(-big, big, "dinkelbach_z")
    for sc in f.scenarios:
        for term in sc.makespan_terms:
            ct = f.model.add(z >= den * g * term - num * sc.on_time)
            if sc.enforce:
                ct.only_enforce_if(sc.enforce)
    f.model.minimize(z)


def ratio(f, solver) -> Fraction:
    """``max_s G·M_s/on_s`` of the solver's current plan, in ticks (exact fraction)."""
    g = f.problem.total_gpus
    best = None
    for sc in f.scenarios:
        if sc.enforce and not all(solver.boolean_value(l) for l in sc.enforce):
            continue
        ms = max(solver.value(t) for t in sc.makespan_terms)
        on = solver.value(sc.on_time) if not isinstance(sc.on_time, int) else sc.on_time
        r = Fraction(g * ms, max(on, 1)) if on > 0 else Fraction(10 ** 30)
        best = r if best is None or r > best else best
    return best


def value(evaluation) -> float:
    return evaluation.worst.cost_gpu_s
