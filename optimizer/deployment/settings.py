"""Every share and tuning constant of the deployment solve strategy, in one documented object.

A solve reads its :class:`SolverSettings` from its :class:`~optimizer.deployment.context.SolveContext`;
nothing reads a module-level tunable at run time. Override a field with
``dataclasses.replace(SolverSettings(), main_share=0.5)`` and pass it to
:func:`optimizer.deployment.solve` (``settings=``). Shares are fractions of the time left when
the phase starts; times are seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class AnytimeSettings:
    """Shares and limits of the anytime search (:func:`optimizer.deployment.anytime_solve.solve_anytime`).

    Shares are fractions of the time left when the step starts (or of the budget, as stated);
    slack factors multiply the LP's makespan.

    Attributes:
        optimal_gap: a plan returned within this relative gap of its bound is reported optimal
        exact_classes: up to this many exact classes the exact search runs on the real instance
        exact_share: share of the time left that the exact search gets on the real instance
        exact_sessions: above this many sessions the exact search gets EXACT_SHARE_LARGE
        exact_share_large: (LNS gets the rest)
        multi_starts: constructive plans improved by local search
        start_share: share of the time left for local moves from the constructive plans (step 2)
        rounded_share: share of the time left for the rounded instances (step 3)
        local_share: share of the time left for local moves before LNS (step 4)
        rounded_levels: (contexts, new tokens, deadlines)
        cg_share: share of the time left for the configuration LP bound (step 2b)
        cg_plan_slack: integer masters at these times the bound's makespan
        cg_batched_min_s: batched kinds: the configuration LP runs only with this much time left
        cg_share_batched: and gets this share of it (the plan search needs the rest)
        repair_share: no plan meets the on-time requirement: LNS repairs one until this share of the budget
        pack_slack: makespan targets of the packings, times the LP's makespan
        gpus_share: objective gpus: share of the time left for the fewest-GPU bisection
        mix_share: share of the time left for the instance-mix search (step 2c)
        mix_pack: makespan targets of its packings, times the LP's makespan
        mix_greedy: and of its list schedules
        mix_steps: instances of one kind a move gives up (their GPUs go to another kind)
        mix_starts: best mixes whose plans start the local search
        small_sessions: without a constructive plan, problems up to this size go to the exact path
        most_on_time_share: of the budget: the most-on-time mix climb when list scheduling misses the requirement
        aggregate_share: LP inconclusive: share of the time left for the aggregate feasibility model
        bounded_share: batched threshold objectives: share of the time left for the bounded column search
    """

    optimal_gap: float = 1e-6
    exact_classes: int = 16
    exact_share: float = 0.6
    exact_sessions: int = 200
    exact_share_large: float = 0.25
    multi_starts: int = 6
    start_share: float = 0.15
    rounded_share: float = 0.1
    local_share: float = 0.1
    rounded_levels: tuple = ((2, 2, 1), (2, 2, 2), (3, 2, 2))
    cg_share: float = 0.5
    cg_plan_slack: tuple = (1.0, 1.01, 1.02, 1.04, 1.06, 1.1)
    cg_batched_min_s: float = 150.0
    cg_share_batched: float = 0.3
    repair_share: float = 0.85
    pack_slack: tuple = (1.02, 1.06, 1.12, 1.2)
    gpus_share: float = 0.3
    mix_share: float = 0.25
    mix_pack: tuple = (1.02, 1.04, 1.06, 1.09)
    mix_greedy: tuple = (1.06, 1.09, 1.12)
    mix_steps: tuple = (1, 2, 4, 8)
    mix_starts: int = 3
    small_sessions: int = 60
    most_on_time_share: float = 0.2
    aggregate_share: float = 0.25
    bounded_share: float = 0.8


@dataclass(frozen=True)
class SolverSettings:
    """Shares and limits of the deployment solve.

    Attributes:
        default_time_limit_s: the main solve's time without ``--time-limit``.
        main_share: with a limit, the main methods' share of the work budget; the comparison
            rows and the conflict explanation share the rest.
        large_sessions: above this many sessions the main methods get ``large_main_share``
            (traffic at scale: the anytime search improves until its deadline, the comparison
            rows could not finish anyway).
        large_main_share: see ``large_sessions``.
        output_s_per_session: kept out of the budget for writing the plan (the JSON takes
            about 10 µs per session).
        explain_ratio, explain_min_s, explain_max_s: without a limit, the comparison rows and
            conflicts get ``explain_ratio`` times the main solve's time, within these bounds.
        infeasible_rows_share: when the main methods proved infeasibility, the comparison rows'
            share of the explanation time (the conflict explanation gets the rest).
        sequence_sessions: up to this many sessions, objectives that need a sequence (latency)
            take the exact sequence model; above it the anytime search.
        sequence_exact_share: with faults, or a sequence objective on a small instance, the
            exact formulations' share of the main time; without a plan by then the anytime
            search (of the run without faults) gives one.
        anytime: the anytime search's shares and limits (:class:`AnytimeSettings`).
    """

    default_time_limit_s: float = 60.0
    main_share: float = 0.6
    large_sessions: int = 60
    large_main_share: float = 0.85
    output_s_per_session: float = 1.5e-5
    explain_ratio: float = 1.5
    explain_min_s: float = 4.0
    explain_max_s: float = 10.0
    infeasible_rows_share: float = 0.5
    sequence_sessions: int = 60
    sequence_exact_share: float = 0.6
    anytime: AnytimeSettings = field(default_factory=AnytimeSettings)

    def describe(self) -> dict:
        """``{field: value}`` (for the docs and ``--format json`` consumers)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["anytime"] = {f.name: getattr(self.anytime, f.name) for f in fields(self.anytime)}
        return out
