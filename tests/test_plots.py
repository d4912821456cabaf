"""``optimize INSTANCE.yaml --plot DIR``: every shipped instance writes its PNGs, the data behind
the figures match the acceptance values, infeasible results write nothing and say so."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from optimizer.schema_base import read_yaml
from tests.conftest import INSTANCES, REPO, SHARED_DATA, assert_one_line_error

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXPECTED = {"deployment": ["timeline.png", "memory.png"], "experts": ["expert_load.png"], "buildout": ["racks.png"]}


def _kind(raw: dict) -> str:
    return "experts" if "experts" in raw else "buildout" if "buildout" in raw else "deployment"


def _instances() -> list[Path]:
    """Every YAML in instances/ that is a problem instance (catalogs and models are not)."""
    out = []
    for p in sorted(INSTANCES.glob("*.yaml")):
        raw = read_yaml(p)
        if isinstance(raw, dict) and ({"experts", "buildout", "model", "workload"} & raw.keys()):
            out.append(p)
    return out


def test_instances_found():
    kinds = {_kind(read_yaml(p)) for p in _instances()}
    assert kinds == {"deployment", "experts", "buildout"}


@pytest.mark.parametrize("path", _instances(), ids=lambda p: p.name)
def test_every_instance_writes_its_pngs(cli, path, tmp_path):
    if "shared/" in path.read_text() and not SHARED_DATA.exists():
        pytest.skip(f"{path.name} needs ../shared/data")
    kind = _kind(read_yaml(path))
    r = cli(path, "--plot", tmp_path / "plots", "--format", "json", "--time-limit", "3")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)  # stdout stays one JSON object
    written = [Path(f) for f in d["files"]]
    assert [f.name for f in written] == EXPECTED[kind]
    for f in written:
        data = f.read_bytes()
        assert data[:8] == PNG_MAGIC, f
        assert len(data) > 5000, f  # a real figure, not an empty canvas


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
    from optimizer.problems import problem_for
    from optimizer.schema_base import apply_overrides

    path = INSTANCES / name
    raw = apply_overrides(read_yaml(path), list(overrides), path)
    return problem_for(raw, path).run(raw, path, objective, time_limit, None)


def test_memory_split_matches_chapter_values():
    """Four TP2 instances of Qwen3-32B at 128K: 52.09 GB per GPU (eq. 6-1, README acceptance values)
    = 32.76 GB weights + 2 GiB reserve + 131072 tokens x 256 KiB / 2 of KV cache."""
    from optimizer.plots import deployment_memory_data

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
    from optimizer.plots import deployment_timeline_data

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
    from optimizer.plots import expert_load_data

    rep = _report("deepseek_v3_ep32.yaml", time_limit=2.0)
    d = expert_load_data(rep)
    assert d.greedy.shape == d.optimized.shape == (len(rep.rows), rep.meta["num_gpus"])
    for i, r in enumerate(rep.rows):
        assert d.greedy[i].max() == pytest.approx(r.greedy.max_load)
        assert d.optimized[i].max() == pytest.approx(r.optimized.max_load)
        assert d.greedy[i].sum() == pytest.approx(d.optimized[i].sum())
        assert d.optimized[i].max() <= d.greedy[i].max() + 1e-9


def test_rack_layout_of_the_chapter_example():
    """120 kW: 11 HGX H100 servers in 2 air racks of 3 and 1 liquid rack of 5 (README example)."""
    from optimizer.plots import buildout_layout_data

    lay = buildout_layout_data(_report("hgx_h100_120kw.yaml"))
    got = sorted((g.cooling, g.count, g.servers["hgx-h100"]) for g in lay.groups)
    assert got == [("air", 2, 3), ("liquid", 1, 5)]
    assert lay.gpus == 88 and lay.rack_units == 42 and lay.units_of["hgx-h100"] == 8
