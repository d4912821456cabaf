"""Every share and tuning constant of the deployment solve strategy, in one documented object.

A solve reads its :class:`SolverSettings` from its :class:`~optimizer.deployment.context.SolveContext`;
nothing reads a module-level tunable at run time. Override a field with
``dataclasses.replace(SolverSettings(), main_share=0.5)`` and pass it to
:func:`optimizer.deployment.solve` (``settings=``). Shares are fractions of the time left when
the phase starts; times are seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


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
    """

    default_time_limit_s: float = 60.0
    main_share: float = 0.6
    large_sessions: int = 60
    large_main_share: float = 0.85
    output_s_per_session: float = 1.5e-5
    explain_ratio: float = 1.5
    explain_min_s: float = 2.0
    explain_max_s: float = 10.0
    infeasible_rows_share: float = 0.5
    sequence_sessions: int = 60
    sequence_exact_share: float = 0.6

    def describe(self) -> dict:
        """``{field: value}`` (for the docs and ``--format json`` consumers)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
