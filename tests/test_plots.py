"""``optimize INSTANCE.yaml --plot DIR``: every shipped instance writes its PNGs, the data behind
the figures match the acceptance values, infeasible results write nothing and say so, and plots
dispatch through the problem registry (``ProblemSpec.plots``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from optimizer.errors import InputError
from optimizer.schema_base import read_yaml
from tests.conftest import INSTANCES, REPO, SHARED_DATA, assert_one_line_error, shared
from tests.supernode_helpers import small_instance

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXPECTED = {"deployment": ["timeline.png", "memory.png"], "experts": ["expert_load.png"], "buildout": ["racks.png"],
            "supernode": ["supernode_options.png"], "serving": ["serving_plan.png"]}
EXPECTED_BY_INSTANCE = {"serving_azure_conv_day.yaml": ["schedule.png"], "serving_llama70b_day_windows.yaml": ["schedule.png"]}  # a day plan (optimizer/serving/dayplots.py)


def _kind(path: Path) -> str | None:
    """The registry section that solves this YAML, None for catalogs, models and other data."""
    from optimizer.problems import problem_spec_for

    raw = read_yaml(path)
    if not isinstance(raw, dict):
        return None
    try:
        return problem_spec_for(raw, path).section
    except InputError:
        return None


def _instances() -> list[Path]:
    """Every YAML in instances/ that is a problem instance (catalogs and models are not)."""
    return [p for p in sorted(INSTANCES.glob("*.yaml")) if _kind(p) is not None]


def test_instances_found():
    kinds = {_kind(p) for p in _instances()}
    assert set(EXPECTED) <= kinds


def _assert_pngs(files: list[Path]) -> None:
    assert files
    for f in files:
        data = f.read_bytes()
        assert data[:8] == PNG_MAGIC, f
        assert len(data) > 5000, f  # a real figure, not an empty canvas


def expected_pngs(path: Path) -> list[str] | None:
    """The PNG names ``--plot`` must write for the instance at ``path`` (None: any, at least one).
    Every instance is run once, with ``--plot`` and ``--output``, by
    tests/test_result_envelope.py::test_every_instance_output_validates_and_plots."""
    from optimizer.problems import registry

    kind = _kind(path)
    assert registry()[kind].plots, f"{path.name}: problem '{kind}' declares no plots module (ProblemSpec.plots)"
    return EXPECTED_BY_INSTANCE.get(path.name, EXPECTED[kind]) if kind in EXPECTED else None


def assert_instance_pngs(path: Path, plots: Path, files: list[str]) -> None:
    """``files`` (the envelope's ``files`` in ``plots``) are the PNGs expected of
    ``path``, each a real figure, and exactly what ``plots`` holds."""
    written = [Path(f) for f in files]
    want = expected_pngs(path)
    if want is not None:
        assert [f.name for f in written] == want
    assert sorted(f.name for f in plots.iterdir()) == sorted(f.name for f in written)
    _assert_pngs(written)


def test_table_format_lists_files_on_stderr(cli, tmp_path):
    r = cli(INSTANCES / "qwen32b_128k.yaml", "--plot", tmp_path)
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == [f"wrote {tmp_path / 'timeline.png'}", f"wrote {tmp_path / 'memory.png'}"]
    assert "timeline.png" not in r.stdout


def test_output_result_json_lists_plots(cli, tmp_path):
    r = cli(INSTANCES / "hgx_h100_120kw.yaml", "--plot", tmp_path / "p", "--output", tmp_path / "o")
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "o" / "result.json").read_text())
    assert d["files"] == [str(tmp_path / "p" / "racks.png"), str(tmp_path / "o" / "result.json")]


@pytest.mark.parametrize("args", [
    ("qwen32b_128k.yaml", "--set", "deployment.tensor_parallel=[1]"),  # 102.03 GB per GPU > 80 GB
    ("hgx_h100_120kw.yaml", "--set", "buildout.target_gpus=96"),       # needs 122.4 kW > 120 kW
], ids=["deployment", "buildout"])
def test_infeasible_writes_nothing_and_says_so(cli, tmp_path, args):
    r = cli(INSTANCES / args[0], *args[1:], "--plot", tmp_path / "p", "--format", "json")
    assert r.exit_code == 3, r.output
    d = json.loads(r.stdout)
    assert "files" not in d
    assert list((tmp_path / "p").iterdir()) == []
    assert "no plot:" in r.stderr and "infeasible" in r.stderr


def test_infeasible_experts_writes_nothing(cli, tmp_path):
    """5 slots per GPU but 4 experts: replicas of one expert cannot share a GPU."""
    (tmp_path / "t.json").write_text("[[5, 3, 2, 1]]")
    (tmp_path / "i.yaml").write_text("experts:\n  trace: t.json\n  format: matrix\n  num_gpus: 2\n  num_nodes: 1\n"
                                      "  slots_per_gpu: 5\n  evaluate_windows: none\n")
    r = cli(tmp_path / "i.yaml", "--plot", tmp_path / "p")
    assert r.exit_code == 3, r.output
    assert list((tmp_path / "p").iterdir()) == []
    assert r.stderr.strip() == "no plot: experts: no placement (infeasible), no load plot"


def test_plot_folder_that_cannot_be_made_is_bad_input(cli, tmp_path):
    f = tmp_path / "taken"
    f.write_text("x")
    r = cli(INSTANCES / "hgx_h100_120kw.yaml", "--plot", f / "plots")
    assert_one_line_error(r, "cannot write", code=2)


# ---------------------------------------------------------------- data behind the figures
def _report(name: str, *overrides: str, objective=None, time_limit=None):
    from optimizer.budget import Budget
    from optimizer.problems import problem_spec_for, run_problem
    from optimizer.schema_base import apply_overrides

    path = INSTANCES / name
    raw = apply_overrides(read_yaml(path), list(overrides), path)
    return run_problem(problem_spec_for(raw, path), raw, path, objective, Budget.for_command(time_limit, started=__import__("time").perf_counter()))


def test_memory_split_matches_chapter_values():
    """Four TP2 instances of Qwen3-32B at 128K: 52.09 GB per GPU (eq. 6-1, README acceptance values)
    = 32.76 GB weights + 2 GiB reserve + 131072 tokens x 256 KiB / 2 of KV cache."""
    from optimizer.deployment.plots import deployment_memory_data

    m = deployment_memory_data(_report("qwen32b_128k.yaml", objective="cost"))
    total = m.weights_gb + m.kv_gb + m.reserve_gb
    assert np.allclose(total, 52.09, atol=0.005)
    assert np.allclose(m.reserve_gb, 2 * 2**30 / 1e9)
    assert np.allclose(m.kv_gb, 131072 * 256 * 1024 / 2 / 1e9, rtol=1e-12)
    assert m.capacity_gb == 80
    assert m.instance == ["i0", "i0", "i1", "i1", "i2", "i2", "i3", "i3"]


def test_timeline_nominal_and_worst_fault():
    """Fault at 20 ms stalling 40 ms on a TP2 instance: its session restarts at 60 ms and ends at
    60 + 119.11 ms, past the 130 ms deadline; the other three stay on time."""
    from optimizer.deployment.plots import deployment_timeline_data

    tl = deployment_timeline_data(_report("qwen32b_128k_fault.yaml"))
    nominal, worst = tl.panels
    bars = [b for bs in nominal.bars.values() for b in bs]
    assert len(bars) == 4 and all(b.on_time for b in bars)
    assert all(abs(b.finish_ms - 119.1) < 0.05 and b.deadline_ms == 130 for b in bars)
    assert not nominal.stalls
    assert len(worst.stalls) == 1
    row, a, e = worst.stalls[0]
    assert (a, e) == pytest.approx((20.0, 60.0))
    hit = worst.bars[row]
    assert len(hit) == 1 and not hit[0].on_time
    assert hit[0].start_ms == pytest.approx(60.0) and hit[0].finish_ms == pytest.approx(60 + 119.1, abs=0.05)
    assert sum(b.on_time for bs in worst.bars.values() for b in bs) == 3


def test_expert_loads_match_report():
    """Per-GPU loads behind the figure: their maxima are the report's greedy and optimised max
    loads, and every plan places each layer's whole token count."""
    from optimizer.experts.plots import expert_load_data

    rep = _report("deepseek_v3_ep32.yaml", time_limit=2.0)
    d = expert_load_data(rep)
    assert d.greedy.shape == d.optimized.shape == (len(rep.rows), rep.data.num_gpus)
    for i, r in enumerate(rep.rows):
        assert d.greedy[i].max() == pytest.approx(r.greedy.max_load)
        assert d.optimized[i].max() == pytest.approx(r.optimized.max_load)
        assert d.greedy[i].sum() == pytest.approx(d.optimized[i].sum())
        assert d.optimized[i].max() <= d.greedy[i].max() + 1e-9


def test_rack_layout_of_the_chapter_example():
    """120 kW: 11 HGX H100 servers in 2 air racks of 3 and 1 liquid rack of 5 (README example)."""
    from optimizer.buildout.plots import buildout_layout_data

    lay = buildout_layout_data(_report("hgx_h100_120kw.yaml"))
    got = sorted((g.cooling, g.count, g.servers["hgx-h100"]) for g in lay.groups)
    assert got == [("air", 2, 3), ("liquid", 1, 5)]
    assert lay.gpus == 88 and lay.rack_units == 42 and lay.units_of["hgx-h100"] == 8


# ---------------------------------------------------------------- registry dispatch
TOY_REPORT = '''from optimizer.result import Status


class Report:
    def __init__(self, status):
        self.status = Status(status)

    def to_dict(self):
        return {"problem": "toy", "status": self.status.value}

    def render(self, console):
        console.print("toy result")


class Toy:
    """A toy problem on the pipeline protocol: the instance names the status to report."""

    def load(self, raw, path, objective=None):
        (section,) = raw.values()
        return section["status"]

    def build(self, data):
        return None

    def solve(self, data, budget, progress=None):
        return data

    def evaluate(self, data, plan):
        return None

    def explain(self, data, solution, budget):
        return None

    def report(self, data, solution, explanation):
        return Report(solution)


PIPELINE = Toy()
'''

TOY_PLOTS = '''from optimizer.plots import NoPlot, figure, save


def write(report, folder):
    if report.status.value != "optimal":
        raise NoPlot(f"toy: nothing to draw ({report.status.value})")
    fig = figure(4, 3)
    fig.subplots().plot([0, 1, 2], [2, 0, 1])
    return [save(fig, folder / "toy.png")]
'''


@pytest.fixture
def toy_problem(tmp_path, monkeypatch):
    """Register ``optimizer.<name>`` from a temporary folder; yields a function making one."""
    import optimizer
    from optimizer import problems

    made = []

    def make(name: str, plots: bool) -> Path:
        pkg = tmp_path / "pkgs" / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(TOY_REPORT)
        extra = f", plots='optimizer.{name}.plots'" if plots else ""
        (pkg / "spec.py").write_text("from optimizer.problems import ProblemSpec\n"
                                     f"SPEC = ProblemSpec(section='{name}', package='optimizer.{name}', "
                                     f"summary='a toy'{extra})\n")
        if plots:
            (pkg / "plots.py").write_text(TOY_PLOTS)
        monkeypatch.setattr(optimizer, "__path__", list(optimizer.__path__) + [str(tmp_path / "pkgs")])
        problems.registry.cache_clear()
        made.append(name)
        return tmp_path

    yield make
    problems.registry.cache_clear()
    for name in made:
        for mod in (f"optimizer.{name}", f"optimizer.{name}.spec", f"optimizer.{name}.plots"):
            sys.modules.pop(mod, None)


@pytest.mark.parametrize("status,code", [("optimal", 0), ("infeasible", 3)])
def test_problem_without_plots_says_so_in_one_line(cli, toy_problem, tmp_path, status, code):
    """A registered problem whose spec names no plots module: one stderr line, nothing written,
    the exit code of its status (0 optimal, 3 infeasible), no traceback."""
    toy_problem("toyplain", plots=False)
    (tmp_path / "t.yaml").write_text(f"toyplain:\n  status: {status}\n")
    r = cli(tmp_path / "t.yaml", "--plot", tmp_path / "p")
    assert r.exit_code == code, r.output
    assert r.stderr.splitlines() == ["no plots for toyplain"]
    assert "toy result" in r.stdout and "Traceback" not in r.output
    assert not (tmp_path / "p").exists()
    r = cli(tmp_path / "t.yaml", "--plot", tmp_path / "p", "--format", "json")
    assert r.exit_code == code
    assert json.loads(r.stdout) == {"problem": "toy", "status": status}
    assert r.stderr.strip() == "no plots for toyplain"


def test_new_problem_plots_plug_in_through_its_spec(cli, toy_problem, tmp_path):
    """A new problem's plots module is found through its spec alone (no dispatcher edit); its
    NoPlot reason becomes the one ``no plot:`` line."""
    toy_problem("toydrawn", plots=True)
    (tmp_path / "t.yaml").write_text("toydrawn:\n  status: optimal\n")
    r = cli(tmp_path / "t.yaml", "--plot", tmp_path / "p", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["files"] == [str(tmp_path / "p" / "toy.png")]
    _assert_pngs([tmp_path / "p" / "toy.png"])
    (tmp_path / "t.yaml").write_text("toydrawn:\n  status: infeasible\n")
    r = cli(tmp_path / "t.yaml", "--plot", tmp_path / "q")
    assert r.exit_code == 3
    assert r.stderr.strip() == "no plot: toy: nothing to draw (infeasible)"
    assert list((tmp_path / "q").iterdir()) == []


def test_every_declared_plots_module_has_write():
    import importlib

    from optimizer.problems import registry

    declared = {s.section: s.plots for s in registry().values() if s.plots}
    assert set(EXPECTED) <= set(declared)
    for section, mod in declared.items():
        assert callable(getattr(importlib.import_module(mod), "write", None)), f"{section}: {mod}.write"


def test_plots_dispatcher_names_no_problem():
    """The central module keeps shared helpers only: its code (docstrings aside) names no report
    class and no problem, so adding a problem's plots needs no edit there."""
    import ast

    tree = ast.parse((REPO / "optimizer" / "plots.py").read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    code = ast.unparse(tree)
    for word in ("isinstance", "Report", "deployment", "experts", "buildout", "supernode"):
        assert word not in code, word


# ---------------------------------------------------------------- supernode
GB = 1e9


def test_supernode_options_chapter_values():
    """Chapter 6.7.4 (README acceptance values): S=8 holds 71.01 GB of weights per card and 37
    sessions (2,632 tokens/s per card); S=64, chosen 4 times, 17.22 GB and 335 sessions
    (19,420 tokens/s per card) filling 79.90 of 80 GB with 2 GiB reserve and 335 x 0.181 GB KV."""
    shared("models", "deepseek-ai--DeepSeek-V4.1-Flash.inventory.yaml")
    from optimizer.supernode.plots import supernode_options_data

    rep = _report("supernode_v41_flash.yaml", time_limit=5.0)
    d = supernode_options_data(rep)
    assert [o.size for o in d.options] == [8, 64, 128, 256]
    assert [o.count for o in d.options] == [0, 4, 0, 0]
    assert [o.sessions_per_card for o in d.options] == [37, 335, 356, 367]
    assert [round(o.tokens_per_s_per_card) for o in d.options[:2]] == [2632, 19420]
    assert d.capacity_gb == 80
    by = {s.size: s for s in d.stacks}
    assert sorted(by) == [8, 64, 128, 256] and [s.count for s in d.stacks] == [0, 4, 0, 0]
    w8 = by[8].replicated_gb + by[8].experts_gb + by[8].tables_gb
    w64 = by[64].replicated_gb + by[64].experts_gb + by[64].tables_gb
    assert w8 == pytest.approx(71.01, abs=0.005) and w64 == pytest.approx(17.22, abs=0.005)
    assert by[64].total_gb == pytest.approx(79.90, abs=0.005)
    assert by[64].reserve_gb == pytest.approx(2 * 2**30 / GB, rel=1e-12)
    assert by[64].kv_gb / 335 == pytest.approx(0.181, abs=0.0005)
    # the figure's bars are the report's numbers (result envelope)
    inst = rep.to_dict()["plan"]["instances"][0]
    assert inst["size"] == 64 and inst["count"] == 4
    assert w64 == pytest.approx(inst["weights_per_card_gb"], abs=1e-6)
    assert by[64].total_gb == pytest.approx(inst["hbm_used_gb"], abs=1e-6)


def _small_report(tmp_path, **supernode):
    from optimizer.budget import Budget
    from optimizer.problems import problem_spec_for, run_problem

    path = small_instance(tmp_path, **supernode)
    raw = read_yaml(path)
    return run_problem(problem_spec_for(raw, path), raw, path, None, Budget.for_command(5.0, started=__import__("time").perf_counter()))


def test_supernode_memory_split_by_hand(tmp_path):
    """Synthetic model (tests/supernode_helpers.py): 2.5 GB replicated, 6.4 GB routed experts,
    one 10M x 500 B table + 0.1 GB projection = 5.1 GB, KV 1 MB + 1000 B x 4000 = 5 MB per
    session, 1 GiB reserve. Options: S=4 NVLink, S=8 NVLink and NIC, S=16 NIC (16 > 8-card
    domain) x 4 table tiers = 16."""
    from optimizer.supernode.plots import supernode_options_data

    d = supernode_options_data(_small_report(tmp_path))
    assert len(d.options) == 16
    assert [(o.size, o.fabric) for o in d.options[::4]] == [(4, "NVLink"), (8, "NVLink"), (8, "NIC"), (16, "NIC")]
    assert sum(o.count * o.size for o in d.options) <= 16
    assert any(s.count for s in d.stacks)
    # one stack per size/fabric group: the plan's options and the best of the others
    assert len({(s.size, s.fabric) for s in d.stacks}) == len(d.stacks) == 4
    for s in d.stacks:
        assert s.replicated_gb == pytest.approx(2.5, rel=1e-12)
        assert s.experts_gb == pytest.approx(6.4 / s.size, rel=1e-12)
        assert s.tables_gb == pytest.approx((5.1 if s.tables[0] == "hbm" else 0.0) / s.size, rel=1e-12)
        assert s.kv_gb == pytest.approx(s.sessions_per_card * 0.005, rel=1e-12)
        assert s.reserve_gb == pytest.approx(2**30 / GB, rel=1e-12)
        assert s.total_gb <= 24 + 1e-9  # the toy card's HBM
    assert d.capacity_gb == 24


def test_supernode_many_options_png(cli, tmp_path):
    """32 options (KV in HBM or host): the grouped layout with the tier strip, without shared data."""
    path = small_instance(tmp_path, kv_tiers=["hbm", "host"])
    r = cli(path, "--plot", tmp_path / "p", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["files"] == [str(tmp_path / "p" / "supernode_options.png")]
    _assert_pngs([tmp_path / "p" / "supernode_options.png"])


def test_supernode_infeasible_writes_nothing(cli, tmp_path):
    """A 0.001 ms per-token target: no option holds one session; nothing is drawn."""
    path = small_instance(tmp_path, slo_ms_per_token=0.001)
    r = cli(path, "--plot", tmp_path / "p")
    assert r.exit_code == 3, r.output
    assert list((tmp_path / "p").iterdir()) == []
    assert r.stderr.strip() == "no plot: supernode: no plan (infeasible), no options plot"


def test_serving_plan_figure_data_match_the_result():
    """The serving figure's GPUs per role and SLO figures are the result's own numbers."""
    from optimizer.serving.plots import serving_plan_data

    from optimizer import run_instance

    path = INSTANCES / "serving_llama70b_h100.yaml"
    rep = run_instance(path)
    d = serving_plan_data(rep)
    env = rep.to_dict()
    rate = env["plan"]["rates"][0]
    for m in d.modes:
        mode = rate["modes"][m.mode]
        if m.ok:
            assert sum(m.gpus_by_role.values()) == mode["gpus"]
            assert m.tpot_ms[1] == mode["simulated"]["tpot_ms"]["p90"]
    assert d.best_mode == rate["best_mode"]
