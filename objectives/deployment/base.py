"""The deployment problem's objective interface (one object per objective, one module each).

An objective says how the formulations optimise it and how to read its value from the
independent evaluator's result; nothing outside ``objectives/deployment/`` compares objective
names. ``kind`` selects the optimisation scheme:

* ``ratio``: ``numerator / on-time sessions``, solved exactly by Dinkelbach's method
  (generalised to a max of ratios over fault scenarios, Crouzeix-Ferland-Schaible 1985);
* ``makespan``: minimise the worst-case makespan (ticks) — makespan and energy;
* ``finish_sum``: minimise the worst-case sum of finish times (sequence formulation);
* ``count``: minimise a count of resources (GPUs), then the makespan among the plans with
  that count.

Time in the formulations is in ticks of :data:`optimizer.deployment.units.TIME_UNIT_S`.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Optional

from objectives.base import Objective
from optimizer.deployment.units import TIME_UNIT_S


@dataclass(frozen=True)
class DeploymentObjective(Objective):
    """Attributes (besides :class:`~objectives.base.Objective`'s):
        kind: ``ratio`` | ``makespan`` | ``finish_sum`` | ``count`` (see the module docstring).
        search: the exact column searches that handle it: ``"cost"`` (ratio ``G·T/v``),
            ``"makespan"`` or None (compact CP-SAT only).
        min_on_time: sessions that must be on time for the value to exist (1 for ratios).
        needs_sequence: order on an instance matters beyond EDD (sequence formulation).
        lp_bound: the anytime LP bound of an objective without a threshold search: ``"gpus"``
            (fewest GPUs the LP needs at any makespan) or ``"gpu_time"`` (least GPU time per
            on-time session); None for none (:func:`optimizer.deployment.anytime.bound_in_unit`).
        decimals: digits shown in tables.
    """

    kind: Literal["ratio", "makespan", "finish_sum", "count"] = "makespan"
    search: Optional[str] = None
    min_on_time: int = 0
    needs_sequence: bool = False
    lp_bound: Optional[str] = None
    decimals: int = 2
    fault_note: str = ""  # why a plan under faults may stay unproven (said in the result's notes)

    # ----------------------------------------------------------------- reading a plan
    def scenario_value(self, problem, r) -> float:
        """Value of one evaluated scenario (:class:`~optimizer.deployment.evaluate.ScenarioResult`)."""
        raise NotImplementedError

    def worst(self, evaluation):
        """The scenario that decides the value (the worst one; ties broken by cost then makespan)."""
        pool = evaluation.scenarios or [evaluation.nominal]
        return max(pool, key=lambda r: (self.scenario_value(evaluation.problem, r), r.cost_gpu_s, r.makespan_s))

    def value(self, evaluation) -> float:
        """Objective value of an evaluated plan, in :attr:`unit`."""
        return self.scenario_value(evaluation.problem, self.worst(evaluation))

    def fmt(self, value: float) -> str:
        return f"{value:.{self.decimals}f} {self.unit}"

    def check(self, problem) -> None:
        """Raise :class:`~optimizer.errors.InputError` when the problem lacks an input this
        objective needs (e.g. a GPU price)."""

    # ----------------------------------------------------------------- formulations
    def apply(self, f, lam: Optional[Fraction] = None) -> None:
        """Set the CP-SAT objective on formulation ``f`` (``lam``: Dinkelbach's λ for ratios)."""
        raise NotImplementedError

    def bound_in_unit(self, problem, solver_bound: float) -> float:
        """A proven bound of the CP-SAT objective (non-ratio kinds) in :attr:`unit`."""
        raise NotImplementedError

    # ratio objectives ------------------------------------------------------
    def numerators(self, f, scenario) -> list:
        """Linear expressions whose max is the scenario's numerator (ratio kind)."""
        raise NotImplementedError

    def ratio_in_unit(self, problem, ratio: Fraction) -> float:
        """A numerator/on-time ratio in solver units (ticks) converted to :attr:`unit`."""
        raise NotImplementedError

    def rounding_slack(self, problem) -> float:
        """How far a ratio computed in ticks may exceed the exact one (unit of the objective).

        Service times are rounded up to whole ticks, so a numerator in GPU·ticks overshoots the
        exact one by less than ``G·N`` ticks (G GPUs, N sessions, one tick per session); divided
        by at least ``max(required on time, 1)`` sessions.
        """
        need = max(problem.required_on_time, self.min_on_time, 1)
        return self.ratio_in_unit(problem, Fraction(problem.total_gpus * len(problem.sessions), need))

    # configuration columns (layouts / batched decode) -------------------------------
    def column_cost(self, gpus: int, load_ticks: int, finish_ticks: int = 0) -> Optional[int]:
        """This objective's term for one instance of ``gpus`` GPUs whose last session finishes at
        ``load_ticks`` and whose sessions' finish times sum to ``finish_ticks``, when the objective
        (its numerator, for ratios) is a sum of such terms over instances; None otherwise (then
        the batched search uses :attr:`search`)."""
        return None

    def numerator_bound(self, problem, makespan_ticks: int) -> Fraction:
        """A lower bound of the ratio from a proven makespan lower bound (0 when none follows)."""
        return Fraction(0)


def apply_dinkelbach(obj: DeploymentObjective, f, lam: Fraction) -> None:
    """``minimise Z`` with ``Z ≥ den·num_s − num·on_s`` for every scenario s and numerator term;
    the optimum is ≥ 0 iff λ = num/den is optimal (Dinkelbach 1967)."""
    num, den = lam.numerator, lam.denominator
    terms = [(sc, t) for sc in f.scenarios for t in obj.numerators(f, sc)]
    big = den * obj_numerator_cap(f) + num * max(1, f.n_sessions)
    z = f.model.new_int_var(-big, big, "dinkelbach_z")
    for sc, term in terms:
        ct = f.model.add(z >= den * term - num * sc.on_time)
        if sc.enforce:
            ct.only_enforce_if(sc.enforce)
    f.model.minimize(z)


def obj_numerator_cap(f) -> int:
    """Upper bound of any numerator term: every GPU busy for the whole horizon."""
    return f.problem.total_gpus * f.horizon


def ratio_of(obj: DeploymentObjective, f, solver) -> Fraction:
    """``max_s numerator_s / on_s`` of the solver's current plan (exact fraction, ticks)."""
    best = None
    for sc in f.scenarios:
        if sc.enforce and not all(solver.boolean_value(lit) for lit in sc.enforce):
            continue
        numer = max(solver.value(t) for t in obj.numerators(f, sc))
        on = sc.on_time if isinstance(sc.on_time, int) else solver.value(sc.on_time)
        r = Fraction(numer, on) if on > 0 else Fraction(10 ** 30)
        best = r if best is None or r > best else best
    return best


def ticks_to_ms(ticks: float) -> float:
    return ticks * TIME_UNIT_S * 1e3
