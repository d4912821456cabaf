"""The deployment problem on the one pipeline of :mod:`optimizer.problems`:

    load      instance file -> DeploymentData (validated problem, objective resolved)
    build     -> the CP-SAT formulation of the exact method (named constraint families)
    solve     -> Solution (frozen): the strategy's methods over one SolveContext
    evaluate  plan -> Evaluation (the independent re-check)
    explain   Solution -> Explanation (binding limits, or conflicts and the best achievable)
    report    (data, solution, explanation) -> DeploymentReport, built once
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from optimizer.budget import Budget, ProgressSink, work_seconds
from optimizer.deployment import strategy
from optimizer.deployment.context import SolveContext
from optimizer.deployment.evaluate import Evaluation, Plan, evaluate
from optimizer.deployment.explain import Explanation, explain
from optimizer.deployment.outcome import SolveOutcome, resolve_objective
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.progress import Progress
from optimizer.deployment.report import DeploymentReport
from optimizer.deployment.schema import Problem, build_problem
from optimizer.deployment.settings import SolverSettings
from optimizer.errors import warn_input

DEFAULT_OBJECTIVE = "cost"


@dataclass(frozen=True)
class DeploymentData:
    """A validated deployment problem and its objective (a name or an objective object)."""

    problem: Problem
    objective: Any = DEFAULT_OBJECTIVE


@dataclass(frozen=True)
class Solution:
    """What the solve step returns; never changed afterwards.

    Attributes:
        outcome: the best plan and bound, with the methods that produced them.
        rows: the comparison rows (each option alone), empty without them.
        perf: the performance model the solve used; objective: the objective object.
        budget: the whole call's budget (the explanation's what-if solves stop by its deadline).
        cut_short: parts the time limit cut short (shared with the budget).
        t0: when the call started (``time.perf_counter()``).
    """

    outcome: SolveOutcome
    rows: tuple
    perf: PerfModel
    objective: Any
    budget: Budget
    cut_short: list
    t0: float

    @property
    def status(self):
        return self.outcome.status


class DeploymentPipeline:
    """load -> build -> solve -> evaluate -> explain -> report for deployment instances."""

    def load(self, raw: dict, path: Path, objective: Optional[str] = None) -> DeploymentData:
        """Raises InputError: bad instance file or unknown objective (one line)."""
        problem = build_problem(raw, path)
        name = objective or DEFAULT_OBJECTIVE
        resolve_objective(problem, name)
        return DeploymentData(problem, name)

    def build(self, data: DeploymentData):
        """The CP-SAT formulation of the exact method for ``data`` (TP-only problems)."""
        from optimizer.deployment.exact import build
        from optimizer.deployment.params import usable_degrees

        problem = data.problem
        perf = PerfModel(problem)
        return build(problem, perf, usable_degrees(problem, perf, problem.degrees), data.objective)

    def solve(self, data: DeploymentData, budget: Optional[Budget] = None, progress: Optional[ProgressSink] = None,
              time_limit_s: Optional[float] = None, compare: bool = True,
              settings: Optional[SolverSettings] = None) -> Solution:
        """The strategy's methods within ``budget`` (or ``time_limit_s`` from now): the main
        methods get ``settings.main_share`` of the work budget (``large_main_share`` above
        ``large_sessions`` sessions), the comparison rows (``compare``) and the explanation the
        rest. With a limit T the work budget is 92 % of T less 0.4 s and 15 µs per session for
        the output, counted from ``budget.start`` (the CLI's start).

        Raises:
            InputError: unknown objective, or an input it needs is missing.
        """
        settings = settings or SolverSettings()
        t0 = time.perf_counter()
        if budget is not None:  # the CLI's reading and validation count against the limit too
            t0, time_limit_s = min(t0, budget.start), budget.limit_s
        problem = data.problem
        obj = resolve_objective(problem, data.objective or DEFAULT_OBJECTIVE)
        perf = PerfModel(problem)
        cut: list = []
        if time_limit_s is None:
            main_s, whole = settings.default_time_limit_s, Budget(t0, None, None, cut)
        else:  # keep a margin for start-up, the binding limits and printing
            reserve = settings.output_s_per_session * len(problem.sessions)
            if budget is not None and budget.deadline is not None:  # the CLI's budget (its --plot reserve kept out)
                work = max(0.5 * time_limit_s, budget.deadline - budget.start - reserve)
            else:
                work = work_seconds(time_limit_s, reserve)
            share = settings.large_main_share if len(problem.sessions) > settings.large_sessions else settings.main_share
            main_s, whole = share * work, Budget(t0, time_limit_s, t0 + work, cut)
            late = time.perf_counter() - t0
            if late >= work:  # start-up and reading used the solve's whole share (e.g. --time-limit 0.001)
                main_s = 0.0
                if late >= time_limit_s:
                    what = f"the limit of {time_limit_s:g} s (counted from the process start) had passed before the solve began"
                else:
                    what = (f"the solve's share of the {time_limit_s:g} s limit ({work:.2f} s, counted from the process "
                            f"start) had been used before the solve began")
                warn_input("--time-limit", "", f"{what} ({late:.2f} s of start-up and reading): the solve ran its minimum "
                           f"steps only, the command may end after the limit, and the status says what they proved")
                cut.append("main solve (its time was used up before it began)")
        main = Budget(t0, main_s, time.perf_counter() + main_s, cut)
        ctx = SolveContext(problem, perf, obj, budget=whole, main=main,
                           progress=Progress(progress, obj.unit, t0 if budget is None else budget.start),
                           settings=settings, compare=explain, t0=t0)
        outcome = strategy.solve(ctx)
        return Solution(outcome, tuple(ctx.rows), perf, obj, ctx.budget, cut, t0)

    def evaluate(self, data: DeploymentData, plan: Plan) -> Evaluation:
        return evaluate(data.problem, plan, PerfModel(data.problem))

    def explain(self, data: DeploymentData, solution: Solution, budget: Optional[Budget] = None) -> Explanation:
        """Binding limits, or conflicts and the best achievable. The what-if solves stop by the
        deadline of the solution's budget: the part of the command's ``budget`` the solve kept for
        them (without a limit, a share of the main solve's time)."""
        end = solution.budget.deadline

        def left() -> float:
            return max(0.0, end - time.perf_counter()) if end is not None else 0.0

        ex = explain(data.problem, solution.perf, solution.objective, solution.outcome, list(solution.rows), left)
        ex.cut_short = solution.cut_short
        return ex

    def report(self, data: DeploymentData, solution: Solution, explanation: Explanation) -> DeploymentReport:
        return DeploymentReport(data.problem, solution.outcome, alternatives=list(solution.rows),
                                binding=explanation.binding, conflict_keys=explanation.conflict_keys,
                                conflict_details=explanation.conflict_details,
                                total_time_s=time.perf_counter() - solution.t0, achievable=explanation.achievable,
                                cut_short=explanation.cut_short, perf=solution.perf)

    def robust_twin(self, raw: dict[str, Any], report: DeploymentReport, path: Path) -> tuple[dict[str, Any], dict]:
        """``--robust``: the instance with every session's ``deadline_ms`` divided by ``1 +`` the
        finish-time band of the nominal plan's source (``report.timing()['error_band']``: the median
        TPOT error over measured runs of the GPU and engine, or the calibration file's own held-out
        error), and what was tightened.

        Raises:
            InputError: the source has no band (uncalibrated: a GPU or engine without measured runs)."""
        import copy

        from optimizer.errors import InputError

        timing = report.timing()
        band = timing.get("error_band")
        if band is None:
            raise InputError(path, "performance", f"--robust needs a measured error band for the nominal plan's "
                                                  f"source ({timing.get('why')}): uncalibrated")
        e = float(band["finish_time_error"])
        twin = copy.deepcopy(raw)
        for s in (twin.get("workload") or {}).get("sessions") or []:
            if isinstance(s, dict) and s.get("deadline_ms") is not None:
                s["deadline_ms"] = float(s["deadline_ms"]) / (1.0 + e)
        return twin, {"tightened": f"every deadline / (1 + {e:.1%}) (finish-time band)", "band": e}


PIPELINE = DeploymentPipeline()
