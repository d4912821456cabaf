"""The README's generated blocks (``python -m benchmarks.readme``) match a fresh run.

Each example block is rerun exactly as the generator runs it; every printed figure must agree
with the README except wall-clock times and, for the time-limited expert search, the optimised
plan's run-dependent figures (see ``benchmarks.readme.normalise``). Benchmarks are not rerun
here (minutes; run by hand), only their markers are checked.
"""
from __future__ import annotations

import pytest

from benchmarks import readme as gen
from tests.conftest import REPO

README = (REPO / "README.md").read_text()
EXAMPLES = [b for b in gen.BLOCKS if b.is_example]


def test_markers_pair_up_and_match_the_generators():
    blocks = gen.blocks_in(README)
    assert set(blocks) == set(gen.BY_NAME)


def test_unpaired_markers_are_refused():
    with pytest.raises(ValueError, match="without its END"):
        gen.blocks_in("<!-- BEGIN generated: x -->\ntext\n")
    with pytest.raises(ValueError, match="without its BEGIN"):
        gen.blocks_in("<!-- END generated: x -->\n")


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda b: b.name)
def test_example_block_matches_a_fresh_run(block):
    instance = REPO / block.command.split()[1]
    if "shared/data" in instance.read_text() and not (REPO.parent / "shared" / "data").exists():
        pytest.skip(f"{instance.name} needs ../shared/data")
    documented = gen.blocks_in(README)[block.name]
    assert documented.splitlines()[1].startswith(f"$ {block.command}")
    fresh = gen.example_text(block.command)
    want, got = gen.comparable_numbers(block, documented), gen.comparable_numbers(block, fresh)
    assert got == want, (f"README block {block.name} is stale: rerun `python -m benchmarks.readme --only "
                         f"{block.name}`\n--- README\n{documented}\n--- fresh run\n{fresh}")


# ------------------------------------------------------------------ the comparison itself
def _example(name: str) -> tuple[gen.Block, str]:
    return gen.BY_NAME[name], gen.blocks_in(README)[name]


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
    """--check exits 1 on a tampered block and writes nothing; a rewrite restores the block's
    figures and leaves every byte outside the markers as it was."""
    name = "buildout-infeasible-example"
    block = gen.BY_NAME[name]
    original = gen.blocks_in(README)[name]
    tampered = README.replace(original, original.replace("122.4 kW", "133.3 kW"))
    assert tampered != README
    path = tmp_path / "README.md"
    path.write_text(tampered)
    assert gen.main(["--check", "--only", name, "--readme", str(path)]) == 1
    assert path.read_text() == tampered
    assert gen.main(["--only", name, "--readme", str(path)]) == 0
    rewritten = path.read_text()
    new_block = gen.blocks_in(rewritten)[name]
    assert gen.comparable_numbers(block, new_block) == gen.comparable_numbers(block, original)
    outside = lambda t: t.replace(gen.blocks_in(t)[name], "")  # noqa: E731
    assert outside(rewritten) == outside(tampered)
    assert gen.main(["--check", "--only", name, "--readme", str(path)]) == 0
