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


@pytest.fixture
def cli():
    """Run the ``optimize`` CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from optimizer.cli import main

    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run
