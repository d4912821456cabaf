"""The generated blocks of README.md and docs/ (``python -m benchmarks.readme``) match a fresh run.

Each example block is rerun exactly as the generator runs it; every printed figure must agree
with the documented block except wall-clock times and, for the time-limited expert search, the
optimised plan's run-dependent figures (see ``benchmarks.readme.normalise``). Benchmarks are not
rerun here (minutes; run by hand), only their markers are checked.
"""
from __future__ import annotations

import pytest

from benchmarks import readme as gen
from tests.conftest import REPO, SHARED_DATA

BLOCKS = gen.all_blocks()
EXAMPLES = [b for b in gen.BLOCKS if b.is_example]
RUNS: dict[str, tuple[str, int]] = {}  # one fresh run per command for this test session


def test_markers_pair_up_and_match_the_generators():
    assert set(BLOCKS) == set(gen.BY_NAME)


def test_every_problem_page_and_the_readme_hold_generated_examples():
    files = {BLOCKS[b.name][0].relative_to(REPO).as_posix() for b in EXAMPLES}
    assert files == {"README.md", "docs/deployment.md", "docs/experts.md", "docs/buildout.md",
                     "docs/supernode.md", "docs/serving.md"}


def test_unpaired_markers_are_refused():
    with pytest.raises(ValueError, match="without its END"):
        gen.blocks_in("<!-- BEGIN generated: x -->\ntext\n")
    with pytest.raises(ValueError, match="without its BEGIN"):
        gen.blocks_in("<!-- END generated: x -->\n")


def test_a_block_in_two_files_is_refused(tmp_path):
    text = "<!-- BEGIN generated: x -->\ntext\n<!-- END generated: x -->\n"
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    with pytest.raises(ValueError, match="appears in .*a.md and .*b.md"):
        gen.blocks_of({a: text, b: text})
    a.write_text(text)
    b.write_text(text)
    assert gen.main(["--check", "--doc", str(a), "--doc", str(b)]) == 2


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda b: b.name)
def test_example_block_matches_a_fresh_run(block):
    instance = REPO / block.command.split()[1]
    if "shared/data" in instance.read_text() and not SHARED_DATA.exists():
        pytest.skip(f"{instance.name} needs ../shared/data")
    path, documented = BLOCKS[block.name]
    assert documented.splitlines()[1].startswith(f"$ {block.command}")
    fresh = gen.example_text(block.command, block.until, RUNS)
    want, got = gen.comparable_numbers(block, documented), gen.comparable_numbers(block, fresh)
    assert got == want, (f"{path.relative_to(REPO)} block {block.name} is stale: rerun `python -m "
                         f"benchmarks.readme --only {block.name}`\n--- documented\n{documented}\n--- fresh run\n{fresh}")


# ------------------------------------------------------------------ excerpts
def test_an_excerpt_stops_before_its_marker_line():
    runs = {"optimize x.yaml": ("title\ntable\nSecond table\nrow\n", 0)}
    assert gen.example_text("optimize x.yaml", "Second", runs) == "```\n$ optimize x.yaml\ntitle\ntable\n…\n```"
    assert gen.example_text("optimize x.yaml", "absent", runs).endswith("table\nSecond table\nrow\n```")
    runs = {"optimize y.yaml": ("out\n", 3)}
    assert gen.example_text("optimize y.yaml", None, runs).startswith("```\n$ optimize y.yaml      # exit code 3\n")


@pytest.mark.parametrize("block", [b for b in EXAMPLES if b.until], ids=lambda b: b.name)
def test_readme_excerpt_is_the_start_of_the_full_output_in_docs(block):
    """The README shows the first lines of an output whose whole text a docs/ page holds."""
    full = next(b for b in EXAMPLES if b.command == block.command and b.until is None)
    assert BLOCKS[block.name][0] == gen.README
    assert BLOCKS[full.name][0].parent == gen.DOCS
    excerpt = BLOCKS[block.name][1]
    assert excerpt.splitlines()[-2] == gen.ELLIPSIS
    head = gen.comparable_numbers(block, excerpt)
    whole = gen.comparable_numbers(full, BLOCKS[full.name][1])
    assert head and len(head) < len(whole) and whole[:len(head)] == head


# ------------------------------------------------------------------ the comparison itself
def _example(name: str) -> tuple[gen.Block, str]:
    return gen.BY_NAME[name], BLOCKS[name][1]


def test_a_changed_figure_is_caught_but_a_changed_time_is_not():
    block, text = _example("buildout-example")
    assert "88 GPUs" in text
    assert gen.comparable_numbers(block, text.replace("88 GPUs", "96 GPUs")) != gen.comparable_numbers(block, text)
    line = next(l for l in text.splitlines() if l.startswith("solver cp-sat"))
    slower = line.replace(line.split(", ")[2], "12.345 s")
    assert slower != line
    assert gen.comparable_numbers(block, text.replace(line, slower)) == gen.comparable_numbers(block, text)


def test_expert_example_masks_only_the_search_dependent_figures():
    block, text = _example("experts-example")
    row = next(l for l in text.splitlines() if l.startswith("│     0 │"))
    cells = row.split("│")
    base = gen.comparable_numbers(block, text)
    greedy_changed = row.replace(cells[3], cells[3].replace("(0.", "(9."))
    assert gen.comparable_numbers(block, text.replace(row, greedy_changed)) != base
    moves_changed = "│".join(cells[:7] + [cells[7].replace(cells[7].strip(), "999")] + cells[8:])
    assert moves_changed != row
    assert gen.comparable_numbers(block, text.replace(row, moves_changed)) == base


def test_check_and_rewrite_touch_only_the_block(tmp_path):
    """Over two documents, --check exits 1 on a tampered block in the second and writes nothing;
    a rewrite restores the block's figures, leaves every byte outside the markers as it was and
    leaves the other document untouched."""
    name = "buildout-infeasible-example"
    block = gen.BY_NAME[name]
    source, original = BLOCKS[name]
    text = source.read_text()
    tampered = text.replace(original, original.replace("122.4 kW", "133.3 kW"))
    assert tampered != text
    readme, page = tmp_path / "README.md", tmp_path / source.name
    readme.write_text(gen.README.read_text())
    page.write_text(tampered)
    docs = ["--doc", str(readme), "--doc", str(page)]
    assert gen.main(["--check", "--only", name, *docs]) == 1
    assert page.read_text() == tampered
    assert gen.main(["--only", name, *docs]) == 0
    rewritten = page.read_text()
    new_block = gen.blocks_in(rewritten)[name]
    assert gen.comparable_numbers(block, new_block) == gen.comparable_numbers(block, original)
    outside = lambda t: t.replace(gen.blocks_in(t)[name], "")  # noqa: E731
    assert outside(rewritten) == outside(tampered)
    assert readme.read_text() == gen.README.read_text()
    assert gen.main(["--check", "--only", name, *docs]) == 0
