"""The measured tables are built cell by cell as lookups need them (issue #38 point 8): the values
a search sees are those of the whole table, and the cells a process built reach the disk cache."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tests.serving_helpers import INSTANCES

pytest.importorskip("aiconfigurator_core")


def _source(model: str = "llama-3.1-8b"):
    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.perf import PerfModel
    from optimizer.model.steptimes import Performance, resolve

    cfg = INSTANCES / "models" / f"{model}.json"
    pm = PerfModel(read_hf_config(cfg), hardware_from_catalog("h100-sxm", "hgx-h100"), 2.0, 2.0, 2 * 2**30,
                   weight_dtype="bf16", kv_dtype="bf16")
    return resolve(Performance("measured", "vllm", path=cfg), pm, cfg, "h100-sxm", hf_id="meta-llama/Llama-3.1-8B")


@pytest.mark.parametrize("seed", range(3))
def test_lazy_cells_give_the_whole_tables_values(tmp_path, monkeypatch, seed):
    from optimizer.model import measured
    from optimizer.model.layout import Layout

    monkeypatch.setenv("SUPERNODE_CACHE_DIR", str(tmp_path / "cache"))
    lay = Layout.tp(random.Random(seed).choice([1, 2]))
    rng = np.random.default_rng(seed)
    p = rng.choice([0.0, 37.0, 512.0, 3000.0, 20000.0], 40)
    d = rng.integers(0, 300, 40).astype(float)
    s = rng.uniform(100, 100_000, 40)
    lazy = _source()
    got = lazy.table(lay).ms(p, d, s)
    tab = lazy.table(lay)
    assert 0 < tab.built < tab.t_ms.size and not tab.complete  # only the corners the lookups need
    whole = _source()  # a second source reads the partial file and completes it
    full = whole.build_all(lay)
    assert full.complete
    assert np.array_equal(full.ms(p, d, s), got)
    measured.save_tables()
    with np.load(tab.path) as z:
        on_disk = z["t_ms"]
    assert not np.isnan(on_disk).any() and np.array_equal(on_disk, full.t_ms)


def test_a_layout_the_estimator_cannot_time_is_refused_whole_at_its_start(tmp_path, monkeypatch):
    """The grid's far corners are asked when a table starts, so a layout the estimator fails on is
    refused before the search, as when every cell was built up front."""
    from optimizer.model import measured
    from optimizer.model.layout import Layout

    monkeypatch.setenv("SUPERNODE_CACHE_DIR", str(tmp_path / "cache"))
    src = _source()
    calls = []

    def failing(lay, i, j, k):
        calls.append(len(i))
        raise RuntimeError("no GEMM data for this shape")

    monkeypatch.setattr(src, "_cells", failing)
    with pytest.raises(measured.NotCovered, match="no GEMM data for this shape"):
        src.table(Layout.tp(1))
    assert calls == [8]
