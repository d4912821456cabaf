"""Supernode family ``target``: the instances hold at least ``target_sessions`` concurrent sessions.

    sum_o S_o N_o x_o >= target_sessions

with ``N_o`` the sessions per card of option o (eq 6-14, capped by the per-token target).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "target"
KEY_FAMILIES = (FAMILY,)
KEY = ConstraintKey(FAMILY, "sessions")


def define(model, p) -> None:
    t = p.target_sessions
    if t is not None:
        model.add(KEY, model.sessions >= t)


def describe(key: ConstraintKey, p) -> str:
    return f"at least {p.target_sessions:,} concurrent sessions"
