"""Family ``deadline``: sessions counted as on time finish by their deadline (inclusive).

aggregate mode, ``deadline[k, by d ms]`` — EDD prefix condition: the on-time sessions of an
instance, run first in earliest-deadline order, all meet their deadlines iff for every
deadline level d: ``Σ_{c: d_c ≤ d} t[p][c] · y[k][c] ≤ d`` (Jackson's rule; late sessions
run after them and do not delay them).

sequence mode, ``deadline[k, position r]``: ``o[k][r] ⇒ F[k][r] ≤ Σ_c d_c · z[k][r][c]``
(positions counted from the end of the instance's run).
"""
from __future__ import annotations

from optimizer.deployment.units import TIME_UNIT_S
from optimizer.result import ConstraintKey

FAMILY = "deadline"


def _ms(ticks: int) -> str:
    from optimizer.deployment.units import TIME_UNIT_S

    return f"{ticks * TIME_UNIT_S * 1e3:g} ms"


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    if f.mode == "aggregate":
        _add_edd(f)
    else:
        _add_positions(f)


def _add_edd(f) -> None:
    by = f.by_slot(f.y)
    for n, k in enumerate(f.slots):
        if n % 64 == 0:
            f.check_time()
        ys = by.get(k.index, {})
        levels = sorted({f.deadline_ticks[c] for c in ys})
        for d in levels:
            due = [c for c in ys if f.deadline_ticks[c] <= d]
            key = ConstraintKey(FAMILY, f"{k.label}, by {_ms(d)}")
            f.nm.add(key, sum(f.ticks(k, c) * ys[c] for c in due) <= d)
            f.key_info[key] = {"slot": k, "deadline_ticks": d, "classes": due}


def position_deadline(f, k, q):
    """Deadline (ticks) of the session at position q of slot k, as an expression."""
    terms = []
    for c in f.classes:
        z = f.z.get((k.index, q, c.index))
        if z is None:
            continue
        d = f.deadline_ticks[c.index]
        terms.append((d if d is not None else f.horizon) * z)
    return sum(terms) if terms else 0


def _add_positions(f) -> None:
    for k in f.slots:
        for q in range(f.Q[k.index]):
            key = ConstraintKey(FAMILY, f"{k.label}, position {q}")
            f.nm.add(key, f.F[k.index, q] <= position_deadline(f, k, q), enforce=[f.o[k.index, q]])
            f.key_info[key] = {"slot": k, "position": q}


def describe(key: ConstraintKey, f) -> str:
    """The EDD prefix row of a replica (the sessions on time up to a deadline fit in it one after
    another), or a session's own deadline."""
    info = f.key_info.get(key, {})
    if "classes" in info:
        k = info["slot"]
        fastest = min(f.options[k.degree].service_s[c] for c in info["classes"])
        return (f"{key}: the sessions a TP{k.degree} instance runs on time up to "
                f"{info['deadline_ticks'] * TIME_UNIT_S * 1e3:.6g} ms must fit in that time, one after "
                f"another (at least {fastest * 1e3:.3f} ms each)")
    return f"{key}: a session counted on time finishes by its deadline"
