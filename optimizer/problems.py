"""Dispatch from an instance's top-level section to the problem that solves it.

Each problem package (``optimizer.deployment``, ``optimizer.experts``, ``optimizer.buildout``)
exposes ``run(raw, path, objective, time_limit_s, output_dir) -> report`` where the report
has ``status`` (:class:`~optimizer.result.Status`), ``to_dict()`` (the ``--format json``
object) and ``render(console)`` (the table output).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from optimizer.errors import EXIT_INFEASIBLE, EXIT_OK, EXIT_TIME_LIMIT, InputError
from optimizer.result import Status

_SECTIONS = {"experts": "optimizer.experts", "buildout": "optimizer.buildout", "supernode": "optimizer.supernode"}
_DEPLOYMENT_KEYS = {"model", "hardware", "workload"}


def problem_for(raw: dict[str, Any], path: Path):
    """Return the problem module for this instance.

    Raises:
        InputError: the instance names no known problem section, or several.
    """
    present = [s for s in _SECTIONS if s in raw]
    if len(present) > 1:
        raise InputError(path, ", ".join(present), "an instance holds one problem: give either experts or buildout")
    if present:
        return importlib.import_module(_SECTIONS[present[0]])
    if _DEPLOYMENT_KEYS & raw.keys():
        return importlib.import_module("optimizer.deployment")
    raise InputError(path, "", "no problem section: expected model/hardware/workload (deployment), experts, or buildout")


def exit_code_for(status: Status) -> int:
    return {
        Status.OPTIMAL: EXIT_OK,
        Status.FEASIBLE: EXIT_OK,
        Status.INFEASIBLE: EXIT_INFEASIBLE,
        Status.TIME_LIMIT: EXIT_TIME_LIMIT,
    }[status]
