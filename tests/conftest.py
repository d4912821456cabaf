"""Shared fixtures: repo paths, the shared data folder (skipped when absent), CLI runner."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
INSTANCES = REPO / "instances"


def shared(*parts: str) -> Path:
    """Path under ../shared/data; skips the test when it is not there (a user's fresh clone)."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared data not present: {p}")
    return p


@pytest.fixture(autouse=True)
def _fresh_clock(monkeypatch):
    """The in-process CLI runs inside pytest's process: its age is not the command's start-up
    (``--time-limit`` counts from the process start for the first command of a process,
    :func:`optimizer.budget.process_age_s`). Subprocess tests keep the real clock."""
    monkeypatch.setattr("optimizer.budget.process_age_s", lambda: 0.0)


@pytest.fixture
def cli():
    """Run the ``optimize`` CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from optimizer.cli import main

    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run


def assert_one_line_error(result, *needles, code: int = 2):
    """A CLI result that failed with ``code`` and exactly one stderr line holding ``needles``."""
    assert result.exit_code == code, result.output
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for n in needles:
        assert n in lines[0], lines[0]


def with_changes(raw: dict, **changes) -> dict:
    """``raw`` with ``a__b=value`` changes applied in place (``deployment__allreduce="tree"``)."""
    for dotted, value in changes.items():
        node = raw
        parts = dotted.split("__")
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = value
    return raw


@pytest.fixture
def cli_any():
    """Run ``optimize`` with any first argument (``calibrate``, ``sweep`` or an instance) through the
    console entry point :func:`optimizer.cli.run` (one-line usage errors); returns an object with
    ``exit_code``, ``stdout``, ``stderr`` and ``output``."""
    from types import SimpleNamespace

    from click.testing import CliRunner

    from optimizer.cli import run

    runner = CliRunner()

    def go(*args: str):
        with runner.isolation() as (out, err, both):
            code = 0
            try:
                run([str(a) for a in args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            so, se, bo = out.getvalue().decode(), err.getvalue().decode(), both.getvalue().decode()
        return SimpleNamespace(exit_code=code, stdout=so, stderr=se, output=bo)

    return go
