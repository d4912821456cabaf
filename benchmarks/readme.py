"""Regenerate the documentation's example outputs and benchmark tables: ``python -m benchmarks.readme``.

README.md and every Markdown file under docs/ may hold generated text between markers::

    <!-- BEGIN generated: NAME -->
    ...
    <!-- END generated: NAME -->

Each NAME in :data:`BLOCKS` is either an *example* (a shell command, run as a user runs it:
``optimize ...`` in a fresh process from a folder where ``instances/`` is the repo's) or a
*benchmark* (a function of ``benchmarks/bench_*.py``). Each NAME appears in exactly one file.
The script rewrites the text between each pair of markers with a fresh run; prose outside the
markers is never touched. An example may show only the first lines of its output (``until``),
so the README can show each problem's headline while docs/ holds the whole output.

Options: ``--only NAME`` (repeatable), ``--skip-benchmarks`` (examples only; the benchmarks
take several minutes), ``--check`` (write nothing; print a diff and exit 1 when a block's
comparable content differs from a fresh run: wall-clock times and the run-dependent figures
of time-limited searches are masked, see :func:`normalise`).
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
SHARED_DATA = REPO.parent / "shared" / "data"

BEGIN = "<!-- BEGIN generated: {} -->"
END = "<!-- END generated: {} -->"
MARKER = re.compile(r"^<!-- (BEGIN|END) generated: ([\w-]+) -->$", re.M)


@dataclass(frozen=True)
class Block:
    """One generated block.

    Attributes:
        name: marker name.
        command: for examples, the ``optimize ...`` command line as shown in the block.
        bench: for benchmarks, a function returning the block's text (None: cannot run here,
            e.g. shared data absent; the documented block is then kept).
        volatile: for examples, the kind of run-dependent figures :func:`normalise` masks.
        until: for examples, show the output only up to the first line containing this text,
            then ``…`` (None, or text not printed: the whole output). A marker text, not a
            line count, so a wrapped line above it does not move the cut.
    """

    name: str
    command: Optional[str] = None
    bench: Optional[Callable[[], Optional[str]]] = None
    volatile: str = "times"
    until: Optional[str] = None

    @property
    def is_example(self) -> bool:
        return self.command is not None


# ----------------------------------------------------------------------------- examples
def run_example(command: str) -> tuple[str, int]:
    """Run ``command`` (``optimize ...``) in a fresh process from a temporary folder holding a
    link to the repo's ``instances/`` (so ``--output out/`` lands there). Returns (stdout, exit code),
    with the repo's absolute path removed from the output."""
    args = shlex.split(command)
    assert args[0] == "optimize", command
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "instances").symlink_to(REPO / "instances")
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-m", "optimizer.cli", *args[1:]], cwd=d, env=env,
                           capture_output=True, text=True)
    out = r.stdout.replace(str(REPO.resolve()) + "/", "")
    return out, r.returncode


ELLIPSIS = "…"


def example_text(command: str, until: Optional[str] = None,
                 runs: Optional[dict[str, tuple[str, int]]] = None) -> str:
    """The block of an example: a fenced block with ``$ command`` and its output (up to the
    first line containing ``until``, then a line ``…``, when ``until`` is given). ``runs``
    caches outputs by command, so blocks showing the same command share one run."""
    if runs is not None and command in runs:
        out, code = runs[command]
    else:
        out, code = run_example(command)
        if runs is not None:
            runs[command] = (out, code)
    lines = out.rstrip("\n").splitlines()
    cut = next((i for i, line in enumerate(lines) if until is not None and until in line), None)
    if cut is not None:
        lines = lines[:cut] + [ELLIPSIS]
    first = f"$ {command}" + (f"      # exit code {code}" if code else "")
    return "```\n" + first + "\n" + "\n".join(lines) + "\n```"


# ----------------------------------------------------------------------------- benchmarks
def _stdout_of(fn: Callable[[], None], argv: list[str]) -> str:
    buf = io.StringIO()
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(buf):
            fn()
    finally:
        sys.argv = saved
    return buf.getvalue().rstrip("\n")


def bench_deployment_text() -> str:
    from benchmarks import bench_deployment

    return "```\n" + _stdout_of(bench_deployment.main, ["bench_deployment.py"]) + "\n```"


def bench_buildout_text() -> str:
    from benchmarks import bench_buildout

    return _stdout_of(lambda: bench_buildout.in_process(5), ["bench_buildout.py"])


def bench_buildout_cli_text() -> str:
    from benchmarks import bench_buildout

    out = _stdout_of(lambda: bench_buildout.whole_commands(5), ["bench_buildout.py"])
    return "\n".join(line for line in out.splitlines() if line.startswith("|"))  # the table only


def bench_serving_text() -> str:
    from benchmarks import bench_serving

    return _stdout_of(bench_serving.main, ["bench_serving.py", "--repeats", "3"])


def bench_experts_text() -> str:
    from benchmarks.bench_experts import bench_v3

    sigma, seed = 1.0, 0
    rows = ["| case | layers | wall time | mean gap (max) | optimal layers | mean balancedness trivial / greedy / optimised |",
            "|---|---|---|---|---|---|"]
    for work, label in ((1.0, "DeepSeek-V3 shaped: 256 experts, 288 slots, 32 GPUs, 4 nodes, 8 groups; lognormal(0, "
                               f"{sigma:g}) popularity, 16384 tokens × top-8, seed {seed}"),
                        (0.25, "same, `--work 0.25`")):
        r = bench_v3(None, work, sigma, seed)
        b = r["balancedness"]
        rows.append(f"| {label} | {r['layers']} | {r['wall_s_total']:.0f} s | {100 * r['mean_gap']:.3f} % "
                    f"({100 * r['max_gap']:.3f} %) | {r['proven_optimal_layers']} | "
                    f"{b['trivial']:.3f} / {b['greedy']:.3f} / {b['optimized']:.3f} |")
    return "\n".join(rows)


def bench_esft_text() -> Optional[str]:
    from benchmarks.bench_experts import ESFT, bench_esft
    from optimizer.experts.traces import read_trace

    if not ESFT.exists():
        return None
    lines = ["| task | wall time | mean gap | optimal layers | fitted balancedness trivial / greedy / optimised | "
             "windows 4–7 summed: trivial / greedy / optimised | worst window: trivial / greedy / optimised |",
             "|---|---|---|---|---|---|---|"]
    for task in ("intent", "law"):
        r = bench_esft(task, None, 1.0)
        if r is None:
            return None
        tokens = sum(read_trace(ESFT / task, "topk", 64).tokens_per_window)  # whole records (one window per sequence)
        f, held, worst = r["fitted_balancedness"], r["held_out_summed_balancedness"], r["held_out_worst_window_balancedness"]
        lines.append(f"| {task} ({tokens} tokens) | {r['wall_s_total']:.0f} s | {100 * r['mean_gap']:.3f} % | "
                     f"{r['proven_optimal_layers']} | {f['trivial']:.3f} / {f['greedy']:.3f} / {f['optimized']:.3f} | "
                     f"{held['trivial']:.3f} / {held['greedy']:.3f} / {held['optimized']:.3f} | "
                     f"{worst['trivial']:.3f} / {worst['greedy']:.3f} / {worst['optimized']:.3f} |")
    return "\n".join(lines)


def bench_cli_text() -> str:
    from benchmarks import bench_cli

    return _stdout_of(bench_cli.main, ["bench_cli.py", "--repeats", "3"])


def bench_exactness_text() -> str:
    from benchmarks import bench_exactness

    return bench_exactness.table(bench_exactness.run())


def fidelity_text() -> str:
    """The fidelity tables from ``benchmarks/results/fidelity.json`` (``python -m
    benchmarks.bench_fidelity`` writes it: 2 min on the 2-core machine, so not re-run here)."""
    import json

    from benchmarks import bench_fidelity

    return bench_fidelity.table(json.loads((REPO / "benchmarks" / "results" / "fidelity.json").read_text()))


def fidelity_file_text(name: str) -> str:
    """The tables of another ``bench_fidelity`` result (``--all`` -> ``fidelity_all.json``,
    ``--systems`` -> ``fidelity_systems.json``, with the reasons rows were not predicted)."""
    import json

    from benchmarks import bench_fidelity

    res = json.loads((REPO / "benchmarks" / "results" / name).read_text())
    text = bench_fidelity.table(res) + f"\n\n{len(res['rows'])} rows, {res['wall_s']:.0f} s."
    if res.get("unpredicted"):
        text += "\n\n" + bench_fidelity.unpredicted_table(res["unpredicted"])
    return text


def bench_cold_text() -> str:
    from benchmarks import bench_cold

    return _stdout_of(bench_cold.main, ["bench_cold.py"])


def published_text() -> str:
    """The published-tables rows from ``benchmarks/results/published.json`` (``python -m
    benchmarks.bench_published`` writes it)."""
    import json

    from benchmarks import bench_published

    rows = json.loads((REPO / "benchmarks" / "results" / "published.json").read_text())["rows"]
    return bench_published.markdown(rows) + "\n\n" + bench_published.summary_text(bench_published.summary(rows))


def efficiency_text() -> str:
    """The fitted shares of peak from ``instances/hardware/efficiency.yaml`` (``python -m
    benchmarks.fit_efficiency`` writes it)."""
    import yaml

    from benchmarks import fit_efficiency

    return fit_efficiency.table(yaml.safe_load((REPO / "instances" / "hardware" / "efficiency.yaml").read_text()))


BLOCKS: list[Block] = [
    # README.md: each problem's headline (the docs/ page holds the whole output)
    Block("deployment-brief", command="optimize instances/qwen32b_128k.yaml --objective cost", until="Schedule"),
    Block("experts-brief", command="optimize instances/deepseek_v3_ep32.yaml --output out/", volatile="experts",
          until="Held out:"),
    Block("buildout-brief", command="optimize instances/hgx_h100_120kw.yaml", until="Racks:"),
    Block("supernode-brief", command="optimize instances/supernode_v41_flash.yaml", until="Sizes and placements compared"),
    Block("serving-brief", command="optimize instances/serving_llama70b_h100.yaml", until="Workers of the best plan"),
    Block("supernode-fabric-brief", command="optimize instances/supernode_fabric_512.yaml --objective cost",
          until="Fabrics compared"),
    # docs/
    Block("deployment-example", command="optimize instances/qwen32b_128k.yaml --objective cost"),
    Block("experts-example", command="optimize instances/deepseek_v3_ep32.yaml --output out/", volatile="experts"),
    Block("buildout-example", command="optimize instances/hgx_h100_120kw.yaml"),
    Block("buildout-infeasible-example", command="optimize instances/hgx_h100_120kw.yaml --set buildout.target_gpus=96"),
    Block("deployment-benchmark", bench=bench_deployment_text, volatile="deployment-benchmark"),
    Block("experts-benchmark", bench=bench_experts_text, volatile="experts-benchmark"),
    Block("experts-esft-benchmark", bench=bench_esft_text, volatile="experts-esft-benchmark"),
    Block("buildout-benchmark", bench=bench_buildout_text, volatile="buildout-benchmark"),
    Block("buildout-cli-benchmark", bench=bench_buildout_cli_text, volatile="buildout-cli-benchmark"),
    Block("cli-benchmark", bench=bench_cli_text, volatile="cli-benchmark"),
    Block("supernode-example", command="optimize instances/supernode_v41_flash.yaml"),
    Block("supernode-fabric-64-example", command="optimize instances/supernode_fabric_64.yaml --objective cost"),
    Block("supernode-fabric-512-example", command="optimize instances/supernode_fabric_512.yaml --objective cost"),
    Block("supernode-fabric-generated-example",
          command="optimize instances/supernode_fabric_generated_512.yaml --objective cost"),
    Block("supernode-fabric-skew-example", command="optimize instances/supernode_fabric_skew_64.yaml --objective cost"),
    Block("buildout-scale-up-example", command="optimize instances/hgx_h100_supernode_512.yaml"),
    Block("serving-example", command="optimize instances/serving_llama70b_h100.yaml"),
    Block("serving-infeasible-example", command="optimize instances/serving_qwen3_32b_slow_link.yaml "
                                                "--set serving.mode=disaggregated"),
    Block("serving-cp-example", command="optimize instances/serving_qwen3_32b_long_prompt_cp.yaml"),
    Block("serving-benchmark", bench=bench_serving_text, volatile="serving-benchmark"),
    Block("exactness-benchmark", bench=bench_exactness_text, volatile="exactness-benchmark"),
    Block("fidelity-benchmark", bench=fidelity_text),
    Block("efficiency-fit", bench=efficiency_text),
    Block("fidelity-systems", bench=lambda: fidelity_file_text("fidelity_systems.json")),
    Block("cold-benchmark", bench=bench_cold_text, volatile="cold-benchmark"),
    Block("published-benchmark", bench=published_text),
]
BY_NAME = {b.name: b for b in BLOCKS}


# ----------------------------------------------------------------------------- comparison
TIME = re.compile(r"\d[\d,]*(?:\.\d+)?(?=\s?s\b)")      # "0.026 s", "9.0 s", "1.2s"
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_EXPERT_SUMMARY = [re.compile(p) for p in (
    r"optimised\s+\d[\d.]*",                    # run-dependent optimised figures in summary lines
    r"mean gap\s+[\d.]+%\s+\(max\s+[\d.]+%\)",
    r"proven\s+optimal\s+on\s+\d+/",
)]


def _mask(text: str) -> str:
    return NUMBER.sub("#", text)


def _mask_table_columns(text: str, columns: dict[int, Optional[int]]) -> str:
    """Mask markdown-table cells: ``columns`` maps a column index to None (whole cell) or the
    index of the `` / ``-separated part to mask (e.g. the optimised figure of a/b/c)."""
    out = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = line.strip().strip("|").split("|")
            header = not any(ch.isdigit() for ch in "".join(cells[1:]))
            if not header:
                for i, part in columns.items():
                    if i < len(cells):
                        if part is None:
                            cells[i] = _mask(cells[i])
                        else:
                            parts = cells[i].split(" / ")
                            if part < len(parts):
                                parts[part] = _mask(parts[part])
                            cells[i] = " / ".join(parts)
                line = "|" + "|".join(cells) + "|"
        out.append(line)
    return "\n".join(out)


def _mask_expert_example(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith("│"):
            cells = line.split("│")
            # │ layer │ trivial │ greedy │ optimised │ bound │ gap │ moves │ proven │ next: greedy/opt │
            for i in (4, 6, 7, 8):
                if i < len(cells):
                    cells[i] = _mask(cells[i])
            if len(cells) > 9 and "/" in cells[9]:
                g, o = cells[9].split("/", 1)
                cells[9] = g + "/" + _mask(o)
            line = "│".join(cells)
        lines.append(line)
    text = "\n".join(lines)
    for pat in _EXPERT_SUMMARY:
        text = pat.sub(lambda m: _mask(m.group(0)), text)
    return text


def _mask_deployment_benchmark(text: str) -> str:
    """Fixed-width rows: the last column is the time; a time-limited (feasible) row's value and
    gap depend on how far the search got."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"\(min [\d.]+, max [\d.]+", "(min #, max #", line)
        f = line.split()
        if f and re.fullmatch(r"[\d.]+", f[-1]) and any(w in f for w in ("optimal", "feasible", "infeasible", "time_limit")):
            line = line[: line.rstrip().rfind(f[-1])] + "#"
            if "feasible" in f:
                line = re.sub(r"feasible(\s+)\S+(\s+)\S+", r"feasible\1#\2#", line)
        out.append(line)
    return "\n".join(out)


VOLATILE: dict[str, Callable[[str], str]] = {
    "times": lambda t: t,
    "experts": _mask_expert_example,
    "deployment-benchmark": _mask_deployment_benchmark,
    # | case | layers | wall time | mean gap (max) | trivial / greedy / optimised |
    "experts-benchmark": lambda t: _mask_table_columns(t, {2: None}),
    "exactness-benchmark": lambda t: _mask_table_columns(t, {2: None, 3: None}),
    # | task | wall time | mean gap | fitted t / g / o | later t / g / o |
    "experts-esft-benchmark": lambda t: _mask_table_columns(t, {1: None}),
    # | ... | status | solve s (median) | explain s (median) |
    "buildout-benchmark": lambda t: _mask_table_columns(t, {7: None, 8: None}),
    "cli-benchmark": lambda t: _mask_table_columns(t, {3: None, 4: None, 5: None}),
    "buildout-cli-benchmark": lambda t: _mask_table_columns(t, {2: None, 3: None, 4: None, 5: None}),
    # | case | configurations | model s | solve + simulate s | end to end s | ...
    "serving-benchmark": lambda t: _mask_table_columns(t, {2: None, 3: None, 4: None}),
    "cold-benchmark": lambda t: _mask_table_columns(t, {1: None, 2: None, 3: None}),
}


def normalise(block: Block, text: str) -> str:
    """``text`` with run-dependent figures replaced by ``#``: wall-clock times always; for
    time-limited searches also the figures that depend on how far the search got (the expert
    example's optimised cells, gap, moves and next-window balancedness, keeping trivial, greedy
    and bound; the benchmarks' time columns, gaps and time-limited values)."""
    return VOLATILE[block.volatile](TIME.sub("#", text))


def comparable_numbers(block: Block, text: str) -> list[str]:
    """The figures of ``text`` that a fresh run must reproduce (in order), thousands separators removed."""
    return [n.replace(",", "") for n in NUMBER.findall(normalise(block, text))]


def signature(block: Block, text: str) -> str:
    """Words and comparable figures, without table drawing and spacing (column widths follow values)."""
    t = normalise(block, text)
    t = re.sub(r"[\u2500-\u257f]", " ", t)
    return re.sub(r"\s+", " ", t).strip()


# ----------------------------------------------------------------------------- documents
def documents() -> list[Path]:
    """README.md and every Markdown file under docs/, in a fixed order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks_in(text: str) -> dict[str, str]:
    """Contents between each pair of markers, by name.

    Raises:
        ValueError: unpaired, nested or repeated markers.
    """
    out: dict[str, str] = {}
    open_name, start = None, 0
    for m in MARKER.finditer(text):
        kind, name = m.group(1), m.group(2)
        if kind == "BEGIN":
            if open_name is not None:
                raise ValueError(f"BEGIN {name} inside {open_name}")
            if name in out:
                raise ValueError(f"block {name} appears twice")
            open_name, start = name, m.end()
        else:
            if name != open_name:
                raise ValueError(f"END {name} without its BEGIN")
            out[name] = text[start:m.start()].strip("\n")
            open_name = None
    if open_name is not None:
        raise ValueError(f"BEGIN {open_name} without its END")
    return out


def blocks_of(texts: dict[Path, str]) -> dict[str, tuple[Path, str]]:
    """``{name: (file, contents)}`` over several documents.

    Raises:
        ValueError: a file's markers are malformed (the message names the file), or one name
            appears in two files.
    """
    out: dict[str, tuple[Path, str]] = {}
    for path, text in texts.items():
        try:
            found = blocks_in(text)
        except ValueError as e:
            raise ValueError(f"{_shown(path)}: {e}") from None
        for name, content in found.items():
            if name in out:
                raise ValueError(f"block {name} appears in {_shown(out[name][0])} and {_shown(path)}")
            out[name] = (path, content)
    return out


def all_blocks() -> dict[str, tuple[Path, str]]:
    """Every generated block of README.md and docs/, by name."""
    return blocks_of({p: p.read_text() for p in documents()})


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def replace_block(text: str, name: str, content: str) -> str:
    b, e = BEGIN.format(name), END.format(name)
    i, j = text.index(b) + len(b), text.index(e)
    return text[:i] + "\n" + content.strip("\n") + "\n" + text[j:]


def fresh(block: Block, runs: Optional[dict[str, tuple[str, int]]] = None) -> Optional[str]:
    if block.is_example:
        return example_text(block.command, block.until, runs)
    return block.bench()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.readme", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=list(BY_NAME), metavar="NAME",
                    help=f"regenerate only this block (repeatable): {', '.join(BY_NAME)}")
    ap.add_argument("--skip-benchmarks", action="store_true", help="examples only (benchmarks take minutes)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 with a diff when a block differs from a fresh run (times masked)")
    # documents to use instead of README.md and docs/ (repeatable; tests point it at copies)
    ap.add_argument("--doc", "--readme", dest="docs", action="append", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    paths = a.docs or documents()
    texts = {p: p.read_text() for p in paths}
    try:
        current = blocks_of(texts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    unknown = sorted(set(current) - set(BY_NAME))
    if unknown:
        print(f"error: markers without a generator: {', '.join(unknown)}", file=sys.stderr)
        return 2
    names = a.only or [b.name for b in BLOCKS if not (a.skip_benchmarks and not b.is_example)]
    missing = [n for n in names if n not in current]
    if missing:
        print(f"error: {', '.join(map(_shown, paths))}: no markers for {', '.join(missing)}", file=sys.stderr)
        return 2
    new_texts, differs = dict(texts), []
    runs: dict[str, tuple[str, int]] = {}
    for n in names:
        block = BY_NAME[n]
        path, documented = current[n]
        print(f"{n} ({_shown(path)}): running ...", file=sys.stderr, flush=True)
        content = fresh(block, runs)
        if content is None:
            print(f"{n}: skipped (needs {SHARED_DATA}), block kept", file=sys.stderr)
            continue
        if signature(block, documented) != signature(block, content):
            differs.append(n)
            diff = difflib.unified_diff(documented.splitlines(), content.splitlines(),
                                        f"{_shown(path)} [{n}]", f"fresh run [{n}]", lineterm="")
            if a.check:
                print("\n".join(diff))
        new_texts[path] = replace_block(new_texts[path], n, content)
    if a.check:
        print(f"{len(differs)} of {len(names)} blocks differ" + (f": {', '.join(differs)}" if differs else ""),
              file=sys.stderr)
        return 1 if differs else 0
    changed = [p for p in paths if new_texts[p] != texts[p]]
    for p in changed:
        p.write_text(new_texts[p])
    print(f"rewrote {len(names)} block(s) in {', '.join(map(_shown, changed)) or 'no file'}; "
          f"content changed in: {', '.join(differs) or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
