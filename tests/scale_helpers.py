"""Generated deployment traffic at scale and a fresh-process CLI run, for the tests.

The generators are the product's (:mod:`optimizer.deployment.generate`, which the benchmarks
use too: same seeds, same instances; the tests' docstrings quote figures of those cases). Timing figures (first plan, wall time, gap at 60 s) are the
benchmarks' business (``benchmarks/bench_deployment.py``), not the tests'.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from optimizer.deployment.generate import AZURE_CONV, generate, generate_azure, generate_mixed  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def write(raw: dict, folder: Path, name: str = "case.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_cli_process(*args, timeout: float = 300) -> tuple[int, dict | None, str]:
    """``optimize ARGS --format json`` in a fresh process, as a user runs it: (exit code, the
    JSON envelope or None, stderr). No wall time: timing is the benchmarks' business."""
    r = subprocess.run([sys.executable, "-m", "optimizer.cli", *map(str, args), "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    d = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r.returncode, d, r.stderr
