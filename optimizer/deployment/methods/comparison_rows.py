"""Method ``comparison rows``: each TP degree (or layout) alone, solved in its share of the
explanation time by the main methods restricted to it (:attr:`SolveContext.solve_restricted`).
Its rows go to the report; when a row's plan is better than the main methods' (a row restricted
to one option can find, in its own time, a plan the main search missed), it is the solve's plan,
kept with the main methods' bound (valid for every option): the best plan is simply the best."""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Optional

from objectives.deployment import get
from optimizer.budget import Budget
from optimizer.deployment.context import SolveContext
from optimizer.deployment.exact import max_on_time, warm_row
from optimizer.deployment.explain import Alternative, versus_chosen, memory_rejection, plan_row
from optimizer.deployment.outcome import SolveOutcome
from optimizer.deployment.params import degree_fits_hardware, degree_fits_model, layout_reason
from optimizer.deployment.schema import Problem
from optimizer.result import Status, relative_gap


class ComparisonRows:
    name = "comparison rows"
    bound_is_global = True  # an adopted row's plan carries the main methods' bound

    def applies(self, ctx: SolveContext) -> bool:
        return ctx.compare

    def budget(self, ctx: SolveContext) -> Budget:
        share = ctx.settings.infeasible_rows_share if ctx.outcome is not None and \
            ctx.outcome.status == Status.INFEASIBLE else 1.0
        return ctx.budget.split(share)

    def run(self, ctx: SolveContext, budget: Budget) -> Optional[SolveOutcome]:
        outcome = ctx.outcome
        ctx.rows = alternatives(ctx, ctx.objective, outcome.value, budget.remaining_s(), incumbent=outcome)
        if any(a.reason == "time_limit" for a in ctx.rows):
            budget.note_cut("comparison rows")
        better = adopt_better_row(ctx.problem, ctx.objective, outcome, ctx.rows)
        if better is outcome:
            return None
        return better


METHOD = ComparisonRows()



def adopt_better_row(problem: Problem, objective, outcome, rows: list[Alternative]):
    """The main outcome, or the best comparison row's plan when that is better (or the main
    solve has none): a row restricted to one option can find, in its own time, a plan the
    main search missed (a fresh user's 40 sessions with faults: the chosen plan 1.571, the TP4
    row 1.545; with the makespan objective the main solve had no plan while two rows had
    one). The adopted plan keeps the main solve's bound (valid for every option) and is
    optimal only when that bound meets it; the rows' "vs chosen" texts are rewritten."""
    sign = -1.0 if get(objective).sense == "max" else 1.0
    ok = [a for a in rows if a.outcome is not None and a.value is not None and math.isfinite(a.value)
          and a.outcome.evaluation is not None and not a.outcome.evaluation.violations]
    if not ok:
        return outcome
    best = min(ok, key=lambda a: sign * a.value)
    if outcome.value is not None and outcome.evaluation is not None and \
            sign * best.value >= sign * outcome.value - 1e-9 * max(1.0, abs(outcome.value)):
        return outcome
    bound = outcome.bound
    status = Status.OPTIMAL if bound is not None and sign * bound >= sign * best.value * (1 - 1e-9) else Status.FEASIBLE
    got = best.outcome
    stats = replace(got.stats, status=status, objective=best.value, bound=bound,
                    gap=0.0 if status == Status.OPTIMAL else relative_gap(best.value, bound),
                    name=f"{got.stats.name} (comparison row {best.option})")
    adopted = replace(got, status=status, bound=bound, degrees=outcome.degrees, stats=stats,
                      notes=[f"plan from the comparison row {best.option}: better than the main search's "
                             + (f"({best.value:.6g} against {outcome.value:.6g})" if outcome.value is not None else
                                "(which found none)") + ("; bound from the main search" if bound is not None else
                                                         "; the main search reached no bound")]
                      + [f"comparison row {best.option}: {n}" for n in got.notes])
    for a in ok:  # the texts compared each row with the old chosen plan
        a.reason, a.detail = versus_chosen(a.value, best.value, a.shape)
    return adopted


def alternatives(ctx: SolveContext, objective, best_value: Optional[float],
                 time_budget_s: float, incumbent=None) -> list[Alternative]:
    """One row per allowed TP degree: its best single-degree plan or the reason it has none.

    ``incumbent`` (the main solve's outcome) is reused: a degree its plan uses alone gets the
    plan's row without a solve. The rows share ``time_budget_s``; a row whose solve the budget
    cuts short says ``time_limit``.
    """
    problem, perf = ctx.problem, ctx.perf
    if not problem.tp_only:
        return layout_alternatives(ctx, objective, best_value, time_budget_s, incumbent)
    rows: list[Alternative] = []
    degrees = list(problem.degrees)
    t_end = time.perf_counter() + time_budget_s
    for i, p in enumerate(degrees):
        name = f"tp{p}"
        hw = degree_fits_hardware(problem, p)
        if hw:
            rows.append(Alternative(name, p, "gpus", hw, static=True))
            continue
        heads = degree_fits_model(problem, p)
        if heads:
            rows.append(Alternative(name, p, "heads", heads, static=True))
            continue
        mem = memory_rejection(problem, perf, p)
        if mem:
            c = min(problem.classes, key=lambda c: c.context + c.new)
            rows.append(Alternative(name, p, "memory", mem, static=True,
                                    need_bytes=perf.memory_per_gpu(p, [(c.context, c.new)])))
            continue
        share = max(0.2, (t_end - time.perf_counter()) / max(1, len(degrees) - i))
        ev0 = getattr(incumbent, "evaluation", None)
        if ev0 is not None and ev0.plan.instances and all(inst.degree == p for inst in ev0.plan.instances) \
                and incumbent.status == Status.OPTIMAL:
            out = incumbent  # the optimal plan uses this degree alone: it is this row's optimum too
        elif time.perf_counter() >= t_end:
            rows.append(Alternative(name, p, "time_limit", "not solved: the time limit was used up", status=Status.TIME_LIMIT))
            continue
        else:
            out = warm_row(problem, perf, objective, p, time.perf_counter() + 0.5 * share)
            if out is None:
                out = ctx.solve_restricted(max(0.2, (t_end - time.perf_counter()) / max(1, len(degrees) - i)),
                                           degrees=(p,))
        if out.status in (Status.OPTIMAL, Status.FEASIBLE):
            rows.append(plan_row(problem, objective, name, p, out, best_value, ""))
            continue
        if out.status == Status.TIME_LIMIT:
            rows.append(Alternative(name, p, "time_limit", "no plan found within the time limit", status=out.status))
            continue
        lp_note = next((n for n in out.notes if n.startswith("the LP relaxation proves")), None)
        if lp_note is not None:  # proven by the anytime solve's LP: no compact model to build
            rows.append(Alternative(name, p, "memory" if "cannot all be placed" in lp_note else "deadline", lp_note))
            continue
        best_on = max_on_time(problem, perf, [p], max(0.2, (t_end - time.perf_counter()) / max(1, len(degrees) - i)),
                              undecided=-1)
        n = len(problem.sessions)
        if best_on == -1:  # infeasible, but the most on time was not found in time
            rows.append(Alternative(name, p, "time_limit", "infeasible; the most sessions on time was not found within "
                                    "the time limit", status=Status.TIME_LIMIT))
            continue
        if best_on is None:
            too_big = [c for c in problem.classes if perf.max_sessions(p, c.context, c.new) == 0]
            if too_big:  # some session fits no TP-p instance even alone: say which, and by how much
                c = max(too_big, key=lambda c: c.context + c.new)
                need = perf.memory_per_gpu(p, [(c.context, c.new)])
                detail = (f"{c.session_ids[0]} ({c.context + c.new} tokens) needs {need / 1e9:.2f} GB per GPU "
                          f"> {problem.gpu.memory_bytes / 1e9:g} GB")
            else:
                cap = max(perf.max_sessions(p, c.context, c.new) for c in problem.classes)
                slots = problem.total_gpus // p
                detail = f"{n} sessions do not fit {slots} TP{p} instances (at most {cap} per instance)"
            rows.append(Alternative(name, p, "memory", detail))
        else:
            need = max(problem.required_on_time, get(objective).min_on_time)
            where = " in the worst fault scenario" if problem.faults else ""
            rows.append(Alternative(name, p, "deadline", f"{best_on} of {n} on time{where} < {need} required", on_time=best_on))
    for row in rows:
        row.allreduce = perf.allreduce_source(row.degree)
    return rows


def layout_alternatives(ctx: SolveContext, objective, best_value: Optional[float],
                        time_budget_s: float, incumbent=None) -> list[Alternative]:
    """One row per allowed layout (layouts / batched problems): the best plan using that layout
    alone (batch limits chosen as in the main search), or why it has none."""
    problem, perf = ctx.problem, ctx.perf
    rows: list[Alternative] = []
    lays = list(problem.layouts)
    t_end = time.perf_counter() + time_budget_s
    m = perf.model
    for i, lay in enumerate(lays):
        name = lay.label()
        bad = layout_reason(problem, lay)
        if bad:
            rows.append(Alternative(name, lay.gpus, bad[0], bad[1], static=True))
            continue
        if all(m.max_sessions(lay, c.context, c.new) == 0 for c in problem.classes):
            c = min(problem.classes, key=lambda c: c.context + c.new)
            need = m.memory_per_gpu(lay, [(c.context, c.new)])
            rows.append(Alternative(name, lay.gpus, "memory", f"needs {need / 1e9:.2f} GB per GPU > "
                                    f"{problem.gpu.memory_bytes / 1e9:g} GB", static=True, need_bytes=need))
            continue
        ev0 = getattr(incumbent, "evaluation", None)
        if ev0 is not None and ev0.plan.instances and all(inst.lay == lay for inst in ev0.plan.instances) \
                and incumbent.status == Status.OPTIMAL:
            out = incumbent
        elif time.perf_counter() >= t_end:
            rows.append(Alternative(name, lay.gpus, "time_limit", "not solved: the time limit was used up",
                                    status=Status.TIME_LIMIT))
            continue
        else:
            share = max(0.2, (t_end - time.perf_counter()) / max(1, len(lays) - i))
            out = ctx.solve_restricted(share, layouts=(lay,))
        if out.status in (Status.OPTIMAL, Status.FEASIBLE):
            batches = sorted({inst.max_batch for inst in out.evaluation.plan.instances})
            rows.append(plan_row(problem, objective, name, lay.gpus, out, best_value,
                                 f"batch limit {'/'.join(map(str, batches))}, "))
        elif out.status == Status.TIME_LIMIT:
            rows.append(Alternative(name, lay.gpus, "time_limit", "no plan found within the time limit", status=out.status))
        else:
            n = len(problem.sessions)
            too_big = [c for c in problem.classes if m.max_sessions(lay, c.context, c.new) == 0]
            if too_big:
                c = max(too_big, key=lambda c: c.context + c.new)
                rows.append(Alternative(name, lay.gpus, "memory", f"{c.session_ids[0]} ({c.context + c.new} tokens) "
                                        f"does not fit a {name} instance"))
            else:
                need = max(problem.required_on_time, get(objective).min_on_time)
                rows.append(Alternative(name, lay.gpus, "deadline", f"no plan of {name} instances has {need} of {n} "
                                        f"sessions on time (or they do not fit the GPUs)"))
    for row in rows:
        lay = lays[rows.index(row)]
        if lay.attention_tp > 1 and lay.attention_tp <= problem.total_gpus:
            row.allreduce = perf.model.hw.allreduce_source(lay.attention_tp, perf.message_bytes)
    return rows
