"""Deployment problem: split GPUs into TP instances, assign and order sessions, minimise an
objective (``objectives/deployment/``) under memory, deadline, on-time and fault limits.

The pipeline (``PIPELINE``, :mod:`optimizer.deployment.pipeline`) and the public functions
(:func:`load`, :func:`solve`) live in
:mod:`optimizer.deployment.api` and are imported on first use, so that low-level modules of
this package (``units``, ``perf``) can be imported without the solver stack.
"""
from __future__ import annotations

_API = ("load", "solve", "explain_infeasible", "DEFAULT_OBJECTIVE", "DEFAULT_TIME_LIMIT_S")


def __getattr__(name):
    if name == "PIPELINE":
        from optimizer.deployment.pipeline import PIPELINE

        return PIPELINE
    if name in _API:
        from optimizer.deployment import api

        globals().update({n: getattr(api, n) for n in _API})
        return getattr(api, name)
    raise AttributeError(f"module 'optimizer.deployment' has no attribute {name!r}")
