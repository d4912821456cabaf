"""Write ``instances/hardware/aiconfigurator_index.json``: the database versions aiconfigurator-core
has per (GPU system, engine) and its current one, for the installed aiconfigurator-core.

``python -m benchmarks.aic_index``. The package computes this index by parsing ~250 YAML files
(1.3-2.5 s on the 2-core machine), which a first run would otherwise pay before any step is
timed; :func:`optimizer.model.measured._index` reads the shipped file when its version is the
installed one, and computes (and caches) the index itself otherwise.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "instances" / "hardware" / "aiconfigurator_index.json"


def main() -> int:
    from aiconfigurator_core.sdk import perf_database

    from optimizer.model.measured import _aic

    dbs = perf_database.get_supported_databases()
    index = {}
    for system in sorted(dbs):
        for engine in sorted(dbs[system]):
            have = sorted(dbs[system][engine])
            slots = (perf_database.get_version_slots(system, engine) or {}) if have else {}
            index[f"{system}/{engine}"] = {"versions": have, "current": slots.get("current")}
    OUT.write_text(json.dumps({"aiconfigurator_core": _aic(), "generated_by": "python -m benchmarks.aic_index",
                               "index": index}, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(index)} (system, engine) pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
