"""Errors that the CLI turns into one clear line and an exit code.

Exit codes (the CLI contract):
  0  a plan was found (optimal, or feasible with a gap)
  2  bad input: the message names the file, the field and the problem
  3  the instance is infeasible: the message names the conflicting constraints
  4  the time limit ran out before any plan was found
"""
from __future__ import annotations

from pathlib import Path

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_TIME_LIMIT = 4
EXIT_NOT_FOUND = 5  # no plan found by a search that proves nothing (serving closed loop): not "infeasible"


class InputError(Exception):
    """Bad input: one line naming the file, the field (or position) and the problem.

    Args:
        file: the file the problem is in (instance YAML, config.json, trace, log).
        field: dotted field path or position inside that file ("workload.sessions[0].count",
            "line 12", "layer 3, expert 70"); may be empty for whole-file problems.
        problem: what is wrong, in words a user can act on.
    """

    def __init__(self, file: str | Path | None, field: str, problem: str):
        self.file = str(file) if file is not None else "<input>"
        self.field = field
        self.problem = problem
        super().__init__(self.line())

    def line(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"error: {where}: {self.problem}"


_WARNINGS: list[str] = []  # input warnings of the current command, in order, each once


def warn_input(file: str | Path | None, field: str, problem: str) -> None:
    """Record a warning about an input the run goes on with (a documented default taken for an
    absent field, a check that is off): one line naming the file, the field and what happens.
    The CLI prints the lines on stderr once the input has been read without error
    (:func:`take_warnings`); a run that stops on bad input prints only the error line."""
    where = f"{file if file is not None else '<input>'}: {field}" if field else str(file)
    line = f"warning: {where}: {problem}"
    if line not in _WARNINGS:
        _WARNINGS.append(line)


def take_warnings() -> list[str]:
    """The recorded warning lines, emptying the record."""
    out = list(_WARNINGS)
    _WARNINGS.clear()
    return out
