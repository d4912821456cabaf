"""Shared fixtures: repo paths, the shared data folder (skipped when absent), CLI runner; the
test tiers.

Tiers (markers registered in pyproject.toml): every test gets exactly one of ``unit``,
``integration`` and ``slow``, by this rule, applied in :func:`pytest_collection_modifyitems`:

1. an explicit tier marker on the test (or its module's ``pytestmark``) wins; two explicit
   tiers on one test are a collection error;
2. else a test in one of :data:`UNIT_MODULES` (pure functions and models: no solver run end to
   end, no CLI, no subprocess) is ``unit``;
3. else it is ``integration`` (the CLI in-process or in a subprocess, a solver run end to end).

``slow`` is given explicitly to the tests that take over ~20 s alone on the 2-core machine
(measured with ``pytest --durations=0``). ``pytest -m unit`` is the quick loop,
``pytest -m "not slow" -n 2`` the check before a commit, and ``.ci/run`` runs every tier."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
INSTANCES = REPO / "instances"

TIERS = ("unit", "integration", "slow")
UNIT_MODULES = frozenset({
    "test_catalog_peaks", "test_connections", "test_experts_eplb", "test_fabric", "test_overlap", "test_model_inventory",
    "test_model_layout", "test_perf_golden", "test_perf_layouts", "test_perf_memory_property", "test_serving_model",
    "test_serving_properties", "test_supernode_inventory",
})


def tier_of(item) -> str:
    """The one tier of a collected test (the rule in the module docstring)."""
    explicit = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
    if len(explicit) > 1:
        raise pytest.UsageError(f"{item.nodeid}: more than one tier marker {explicit}")
    if explicit:
        return explicit[0]
    return "unit" if item.module.__name__.rsplit(".", 1)[-1] in UNIT_MODULES else "integration"


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(item)
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))


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
