"""The README's commands themselves: the quick-start main job and every documented
``optimize instances/...`` example (deployment and experts; build-out examples are run by
tests/test_buildout_cli.py; the commands behind generated example blocks are run, and their
output compared, by tests/test_readme_sync.py)."""
from __future__ import annotations

import shlex

import pytest
import yaml

from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def _blocks() -> list[str]:
    """Contents of the README's fenced code blocks."""
    blocks, cur = [], None
    for line in README.splitlines():
        if line.startswith("```"):
            if cur is None:
                cur = []
            else:
                blocks.append("\n".join(cur))
                cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def test_readme_has_install_and_test_commands():
    quick = [l for b in _blocks() for l in b.splitlines() if "pip install" in l]
    assert any(l.rstrip().endswith("optimize instances/qwen32b_128k.yaml --objective cost") for l in quick)
    assert any(l.rstrip().endswith("python -m pytest -q") for l in quick)
    ci = (REPO / ".ci" / "run").read_text()
    test_cmd = next(l for l in quick if l.rstrip().endswith("python -m pytest -q")).strip()
    # .ci/run makes the README's venv and install steps, then runs pytest in that venv (in
    # parallel, every tier: pytest-xdist's -n)
    *setup, run = [step.strip() for step in test_cmd.split("&&")]
    assert setup and all(step in ci for step in setup), (setup, ".ci/run must make the README's venv")
    assert run.removesuffix(" -q") in ci and " -n " in ci, ".ci/run must run the README's pytest, in parallel"


def test_quick_start_main_job(cli):
    line = next(l for b in _blocks() for l in b.splitlines() if "bin/optimize" in l)
    args = shlex.split(line.split("bin/optimize", 1)[1])
    r = cli(REPO / args[0], *args[1:])
    assert r.exit_code == 0, r.output
    assert "optimal" in r.stdout and "0.238" in r.stdout


def _documented() -> list[list[str]]:
    from benchmarks.readme import BLOCKS

    generated = {b.command for b in BLOCKS if b.is_example}
    out = []
    for b in _blocks():
        for line in b.splitlines():
            line = line.split(" #")[0].strip().removeprefix("$ ")
            if line.startswith("optimize instances/") and line not in generated:
                parts = shlex.split(line)[1:]
                data = yaml.safe_load((REPO / parts[0]).read_text())
                if "buildout" not in data:
                    out.append(parts)
    return out


@pytest.mark.parametrize("parts", _documented(), ids=lambda p: " ".join(p))
def test_documented_command(cli, parts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --output out/ lands in a temporary folder
    r = cli(REPO / parts[0], *parts[1:])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
