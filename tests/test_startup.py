"""Start-up: the book instance (solved by HiGHS) does not import OR-Tools, pandas or the other
heavy libraries that only some paths need; importing them cost ~0.45 s of a ~1 s command.

Unit tier on purpose although it runs the command in a subprocess (under 1 s): a fresh
interpreter is the only place where ``sys.modules`` shows what the command imported, and the
quick loop is where a new module-level import should be caught."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

HEAVY = ("ortools", "pandas", "scipy", "matplotlib", "dask", "simpy", "aiconfigurator_core")

_RUN_BOOK = """
import json, sys
from optimizer.cli import run
code = 0
try:
    run(["instances/qwen32b_128k.yaml", "--objective", "cost"])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _run(script: str) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    *printed, last = out.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed)


def test_book_instance_imports_no_cp_sat_nor_pandas():
    facts, printed = _run(_RUN_BOOK)
    assert facts["code"] == 0, printed
    assert "optimal: cost = 0.238 GPU·s per on-time session" in printed
    assert "highs" in printed  # the path under test is the HiGHS one
    assert [m for m in HEAVY if m in facts["loaded"]] == []


def test_building_a_cp_sat_model_imports_ortools():
    """The other side of the contract: the lazy accessor does import OR-Tools when a model is
    built (so the check above is about the path, not about a broken import)."""
    facts, _ = _run("import json, sys\n"
                    "from optimizer.cpsat import NamedModel\n"
                    "before = 'ortools' in sys.modules\n"
                    "NamedModel().model.new_bool_var('b')\n"
                    "print(json.dumps({'before': before, 'after': 'ortools' in sys.modules}))")
    assert facts == {"before": False, "after": True}
