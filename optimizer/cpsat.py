"""A thin CP-SAT model builder that keeps a structured name next to every constraint.

Constraint modules (``constraints/*.py``) call :meth:`NamedModel.add` with a
:class:`~optimizer.result.ConstraintKey`. In *explain mode* every key gets one enforcement
literal; the literals are passed as assumptions so that an infeasible model returns a
small set of conflicting keys (``sufficient_assumptions_for_infeasibility``). OR-Tools
returns a small core only without an objective and on one worker, so the explanation is
always a separate solve of a separate model.

OR-Tools (and pandas, which it imports) is imported when the first model is built or solved,
not with this module: the HiGHS paths (the book instance among them) import this module and
never build a CP-SAT model, and the import costs ~0.45 s of a ~1 s command.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from optimizer.result import ConstraintKey, Status

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


def ortools_cp_model():
    """OR-Tools' ``cp_model`` module, imported on first use (see the module docstring)."""
    from ortools.sat.python import cp_model

    return cp_model


class NamedModel:
    """A ``cp_model.CpModel`` plus a registry of named constraints.

    Args:
        explain: when True, each distinct key is guarded by one Boolean literal that is
            assumed true at solve time, so infeasibility can be traced back to keys.
    """

    def __init__(self, explain: bool = False):
        self.model = ortools_cp_model().CpModel()
        self.explain = explain
        self.keys: dict[ConstraintKey, list[cp_model.Constraint]] = {}
        self._literals: dict[ConstraintKey, cp_model.IntVar] = {}

    def literal(self, key: ConstraintKey) -> cp_model.IntVar:
        lit = self._literals.get(key)
        if lit is None:
            lit = self.model.new_bool_var(f"assume::{key}")
            self._literals[key] = lit
        return lit

    def add(self, key: ConstraintKey, ct_expr, enforce: Iterable | None = None) -> cp_model.Constraint:
        """Add a linear (or Boolean) constraint under ``key``.

        Args:
            key: family and element of the constraint.
            ct_expr: a bounded linear expression (``x + y <= 3``) or a constraint built
                by a callable taking the model, e.g. ``lambda m: m.add_bool_or(...)``.
            enforce: optional literals that must all be true for the constraint to apply.
        """
        ct = ct_expr(self.model) if callable(ct_expr) else self.model.add(ct_expr)
        lits = list(enforce or [])
        if self.explain:
            lits.append(self.literal(key))
        if lits:
            ct.only_enforce_if(lits)
        ct.with_name(str(key))
        self.keys.setdefault(key, []).append(ct)
        return ct

    def conflicting_keys(self, time_limit_s: float = 10.0) -> list[ConstraintKey] | None:
        """Solve the (objective-free) explain-mode model; return the conflicting keys.

        Returns:
            The keys in the infeasible core, an empty list if the constraints without
            assumptions are infeasible on their own (structural), or None when the model
            is feasible or the time ran out.
        """
        if not self.explain:
            raise ValueError("conflicting_keys needs a model built with explain=True")
        self.model.clear_objective()
        lits = list(self._literals.values())
        self.model.clear_assumptions()
        self.model.add_assumptions(lits)
        cp_model = ortools_cp_model()
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_time_in_seconds = time_limit_s
        status = solver.solve(self.model)
        if status != cp_model.INFEASIBLE:
            return None
        by_index = {lit.index: key for key, lit in self._literals.items()}
        core = [by_index[i] for i in solver.sufficient_assumptions_for_infeasibility() if i in by_index]
        return sorted(set(core))

    def _infeasible_with(self, keys: list[ConstraintKey], time_limit_s: float) -> bool:
        self.model.clear_assumptions()
        self.model.add_assumptions([self._literals[k] for k in keys])
        cp_model = ortools_cp_model()
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_time_in_seconds = time_limit_s
        return solver.solve(self.model) == cp_model.INFEASIBLE

    def minimal_conflict(self, time_limit_s: float = 10.0) -> list[ConstraintKey] | None:
        """A conflicting set of keys from which no key can be dropped (deletion filter).

        Starts from CP-SAT's core and tries to drop each key in turn, keeping the drop when
        the rest is still infeasible; stops refining (returning the current, still
        conflicting, set) when the time runs out.
        """
        t_end = time.perf_counter() + time_limit_s
        core = self.conflicting_keys(time_limit_s)
        if not core:
            return core
        i = 0
        while i < len(core) and len(core) > 1:
            left = t_end - time.perf_counter()
            if left <= 0.05:
                break
            trial = core[:i] + core[i + 1:]
            if self._infeasible_with(trial, min(left, 2.0)):
                core = trial
            else:
                i += 1
        return core


@dataclass
class CpSolveOutcome:
    status: Status
    solver: cp_model.CpSolver
    time_s: float
    objective: float | None
    bound: float | None


def _on_solution(fn):
    """A solution callback calling ``fn(objective, bound)`` (model units) at every improving
    solution (the class derives from OR-Tools' base, so it is made after the import)."""
    cp_model = ortools_cp_model()

    class _OnSolution(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            fn(self.objective_value, self.best_objective_bound)

    return _OnSolution()


def solve_cp(model: cp_model.CpModel, time_limit_s: float | None, workers: int = 2,
             hint_solver: cp_model.CpSolver | None = None, seed: int = 0,
             on_solution=None) -> CpSolveOutcome:
    """Solve a CP-SAT model and map its status onto :class:`Status`.

    Args:
        model: the model (with or without objective).
        time_limit_s: wall-clock limit in seconds (None: no limit).
        workers: search workers (the target machine has 2 cores).
        on_solution: optional ``fn(objective, bound)`` called (model units) at every improving
            solution of a model with an objective (e.g. for ``--progress``).
    Returns:
        CpSolveOutcome with the objective and proven bound in model units (None when the
        model has no objective or no solution).
    """
    cp_model = ortools_cp_model()
    solver = cp_model.CpSolver()
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(0.01, float(time_limit_s))
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    t0 = time.perf_counter()
    cb = _on_solution(on_solution) if (on_solution is not None and model.has_objective()) else None
    code = solver.solve(model, cb) if cb is not None else solver.solve(model)
    dt = time.perf_counter() - t0
    has_obj = model.has_objective()
    if code == cp_model.OPTIMAL:
        st = Status.OPTIMAL
    elif code == cp_model.FEASIBLE:
        st = Status.FEASIBLE
    elif code == cp_model.INFEASIBLE:
        st = Status.INFEASIBLE
    elif code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT model invalid: {model.validate()}")
    else:
        st = Status.TIME_LIMIT
    obj = solver.objective_value if (has_obj and st in (Status.OPTIMAL, Status.FEASIBLE)) else None
    bound = solver.best_objective_bound if (has_obj and st in (Status.OPTIMAL, Status.FEASIBLE)) else None
    return CpSolveOutcome(st, solver, dt, obj, bound)
