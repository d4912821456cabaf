"""supernode-optimizer: constraint-solver based deployment optimiser for LLM inference.

Python API::

    from optimizer import run_instance
    report = run_instance("instances/supernode_v41_flash.yaml")      # any problem
    report.status, report.to_dict()                                   # the result envelope

    from optimizer import load_instance, solve                        # deployment problems
    inst = load_instance("instances/qwen32b_128k.yaml")
    result = solve(inst, objective="cost")
"""
from __future__ import annotations

__version__ = "0.1.0"


def run_instance(path, objective: str | None = None, time_limit_s: float | None = None, overrides=()):
    """Solve any instance file as the ``optimize`` command does (the problem is picked by the
    instance's top-level section) and return its report (``status``, ``to_dict()``, ``render``).

    Raises:
        InputError: bad input (file, field and problem in the message).
    """
    import time
    from pathlib import Path

    from optimizer.problems import problem_spec_for, run_problem
    from optimizer.schema_base import apply_overrides, read_yaml

    import math

    from optimizer.errors import InputError

    if time_limit_s is not None and not (isinstance(time_limit_s, (int, float)) and math.isfinite(time_limit_s)
                                         and time_limit_s > 0):
        raise InputError("time_limit_s", "", f"must be a positive number of seconds (got {time_limit_s!r})")
    path = Path(path)
    raw = apply_overrides(read_yaml(path), list(overrides), path)
    from optimizer.budget import Budget

    budget = Budget.for_command(time_limit_s, started=time.perf_counter())  # a library call: from now
    return run_problem(problem_spec_for(raw, path), raw, path, objective, budget)


def load_instance(path, overrides=()):
    """Load and validate a deployment instance YAML (see :func:`optimizer.deployment.load`).

    Raises:
        InputError: bad input, or an instance of another problem (use :func:`run_instance`).
    """
    from pathlib import Path

    from optimizer.errors import InputError
    from optimizer.problems import problem_spec_for, run_problem
    from optimizer.schema_base import read_yaml

    spec = problem_spec_for(read_yaml(Path(path)), Path(path))
    if spec.section != "deployment":
        raise InputError(path, spec.section, f"load_instance reads deployment instances; this is a {spec.section} "
                                             f"instance: use optimizer.run_instance(path)")
    from optimizer.deployment import load

    return load(path, overrides)


def solve(instance, objective: str = "cost", time_limit_s: float | None = None):
    """Solve a loaded deployment instance (see :func:`optimizer.deployment.api.solve`)."""
    from optimizer.deployment import solve as _solve

    return _solve(instance, objective=objective, time_limit_s=time_limit_s)
