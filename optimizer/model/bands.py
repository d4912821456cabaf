"""Measured error bands of the step-time sources per (GPU system, engine): data every serving plan states.

``instances/hardware/fidelity.yaml`` is written by ``python -m benchmarks.bench_fidelity`` (the
median absolute TTFT and TPOT error of each source over the measured rows of that GPU and engine,
nothing fitted on them). A group without rows is "uncalibrated".
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional

import yaml

from optimizer.model.measured import SYSTEMS_FILE

BANDS_FILE = SYSTEMS_FILE.parent / "fidelity.yaml"


@lru_cache(maxsize=4)
def _table(path: Path) -> dict:
    """The fidelity table (``{}`` when absent), read once per file per process."""
    if not path.is_file():
        return {}
    with path.open() as fh:
        return yaml.safe_load(fh) or {}


def band(system: Optional[str], engine: str, source: str) -> Optional[dict]:
    """``{rows, ttft_median_abs_error, tpot_median_abs_error, from}`` of ``source`` for (GPU system,
    engine), or None when the fidelity table has no rows for it (uncalibrated)."""
    if system is None:
        return None
    doc = _table(BANDS_FILE)
    got = doc.get("bands", {}).get(system, {}).get(engine, {}).get(source)
    return None if got is None else {**got, "from": doc.get("source", str(BANDS_FILE))}
