"""The documented commands themselves: the README's install-and-run line (the main job), its
test command, and every ``optimize instances/...`` line of README.md and docs/ (the commands
behind generated example blocks, among them every command the README shows, are run and
compared with their blocks by tests/test_readme_sync.py). Also the README's size and that its links and docs/' links resolve."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from benchmarks.readme import documents
from tests.conftest import REPO, SHARED_DATA

README_PATH = REPO / "README.md"
README = README_PATH.read_text()
MAX_README_LINES = 250


def _blocks(text: str) -> list[str]:
    """Contents of the fenced code blocks of a Markdown text."""
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if cur is None:
                cur = []
            else:
                blocks.append("\n".join(cur))
                cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def test_readme_is_short():
    n = len(README.splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail into docs/"


def test_readme_has_install_and_test_commands():
    lines = [l.strip() for b in _blocks(README) for l in b.splitlines()]
    assert any("pip install" in l and l.endswith("optimize instances/qwen32b_128k.yaml --objective cost")
               for l in lines)
    assert "bash .ci/run" in lines, "the README's test command is the CI script"
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-e '\.\[test\]'", ci) and "python -m pytest -n" in ci  # every tier, in parallel


def test_quick_start_main_job(cli):
    line = next(l for b in _blocks(README) for l in b.splitlines() if "bin/optimize" in l)
    args = shlex.split(line.split("bin/optimize", 1)[1])
    r = cli(REPO / args[0], *args[1:])
    assert r.exit_code == 0, r.output
    assert "optimal" in r.stdout and "0.238" in r.stdout


EXIT_NOTE = re.compile(r"#.*\bexit code (\d)")


def _documented() -> list[tuple[str, list[str], int]]:
    """(file, arguments, exit code) of every ``optimize instances/...`` line in a fenced block
    of README.md or docs/ (``$ `` prompts and ``.venv/bin/`` prefixes removed); the exit code is
    the line's ``# ... exit code N`` note, else 0. Commands behind generated example blocks are
    left to tests/test_readme_sync.py, which runs them and compares their output."""
    from benchmarks.readme import BLOCKS

    generated = {b.command for b in BLOCKS if b.is_example}
    out: list[tuple[str, list[str], int]] = []
    for doc in documents():
        for b in _blocks(doc.read_text()):
            for raw in b.splitlines():
                line = raw.split(" #")[0].strip().removeprefix("$ ").removeprefix(".venv/bin/")
                if line.startswith("optimize instances/") and line not in generated:
                    note = EXIT_NOTE.search(raw)
                    item = (str(doc.relative_to(REPO)), shlex.split(line)[1:], int(note.group(1)) if note else 0)
                    if item not in out:
                        out.append(item)
    return out


DOCUMENTED = _documented()


def test_docs_document_a_command_of_every_problem():
    from benchmarks.readme import BLOCKS

    commands = [parts for _doc, parts, _code in DOCUMENTED]
    commands += [shlex.split(b.command)[1:] for b in BLOCKS if b.is_example]
    sections = set()
    for parts in commands:
        data = yaml.safe_load((REPO / parts[0]).read_text())
        sections |= {"deployment"} if "workload" in data else set(data) & {"experts", "buildout", "supernode", "serving"}
    assert sections == {"deployment", "experts", "buildout", "supernode", "serving"}


@pytest.mark.parametrize("doc,parts,code", DOCUMENTED,
                         ids=[f"{d}: {' '.join(p)}" for d, p, _c in DOCUMENTED])
def test_documented_command(cli, doc, parts, code, tmp_path, monkeypatch):
    instance = REPO / parts[0]
    assert instance.exists(), f"{doc}: {parts[0]} does not exist"
    text = instance.read_text()
    if "shared/data" in text and not SHARED_DATA.exists():
        pytest.skip(f"{instance.name} needs ../shared/data")
    monkeypatch.chdir(tmp_path)  # --output out/ lands in a temporary folder
    r = cli(instance, *parts[1:])
    assert r.exit_code == code, (doc, r.output)
    assert "Traceback" not in r.output


LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (outside fenced blocks)."""
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for target, anchor in LINK.findall(doc.read_text()):
        if "://" in target:
            continue
        path = doc.parent / target if target else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(f"{target}#{anchor}" if anchor else target)
    assert not broken, f"{doc.relative_to(REPO)} has broken links: {broken}"
