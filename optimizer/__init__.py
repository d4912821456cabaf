"""supernode-optimizer: constraint-solver based deployment optimiser for LLM inference.

Python API::

    from optimizer import load_instance, solve
    inst = load_instance("instances/qwen32b_128k.yaml")
    result = solve(inst, objective="cost")
"""
from __future__ import annotations

__version__ = "0.1.0"


def load_instance(path, overrides=()):
    """Load and validate a deployment instance YAML (see :func:`optimizer.deployment.load`)."""
    from optimizer.deployment import load

    return load(path, overrides)


def solve(instance, objective: str = "cost", time_limit_s: float | None = None):
    """Solve a loaded deployment instance (see :func:`optimizer.deployment.solve`)."""
    from optimizer.deployment import solve as _solve

    return _solve(instance, objective=objective, time_limit_s=time_limit_s)
