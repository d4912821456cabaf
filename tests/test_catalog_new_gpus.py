"""Issue #39 point 2: B300, GB200/GB300 NVL72, H20, L20 and A800 in the catalog with their sources;
the measured source covers the GPUs aiconfigurator-core's database has (b300_sxm, gb200, gb300);
an NVL72 rack is one 72-GPU NVLink domain; a GPU the database lacks takes its generation's fitted
factors (Ada, which has none, takes the mean of the fitted generations and says so); and the
supernode systems tell an NVLink Switch System from servers joined by InfiniBand."""
from __future__ import annotations

import pytest

from optimizer.catalog import generation_of, load_catalog, lookup
from optimizer.errors import InputError
from optimizer.model.efficiency import fitted_efficiency
from optimizer.model.hardware import hardware_from_catalog
from optimizer.model.measured import mapping
from tests.serving_helpers import INSTANCES, write

CAT = load_catalog()
NEW = {"b300": "hgx-b300", "gb200": "gb200-nvl72", "gb300": "gb300-nvl72", "h20": "hgx-h20", "l20": "pcie-l20x8",
       "a800-sxm-80gb": "hgx-a800"}


@pytest.mark.parametrize("gpu, server", sorted(NEW.items()))
def test_new_gpus_load_with_sources(gpu, server):
    g, s = CAT["gpus"][gpu], CAT["servers"][server]
    assert g["source"] and s["source"] and gpu in s["gpu_models"]
    hw = hardware_from_catalog(gpu, server)
    assert hw.gpu.memory_bytes == g["memory_gb"] * 1e9 and hw.server.gpus == s["gpus"]
    # catalog bookkeeping is not a field of the GPU (an inline GPU has no generation)
    assert "generation" not in lookup("gpus", gpu, "catalog", "gpu")


def test_every_gpu_has_a_generation():
    assert set(generation_of()) == set(CAT["gpus"])
    assert {generation_of()[g] for g in ("b200", "b300", "gb200", "gb300")} == {"blackwell"}
    assert generation_of()["h20"] == "hopper" and generation_of()["l20"] == "ada"


def test_nvl72_is_one_nvlink_domain():
    """TP8 and a 72-GPU group in an NVL72 rack stay on NVLink; on HGX B300 a 16-GPU group crosses
    to the NIC (100 GB/s, one 800 Gbit/s ConnectX-8 per GPU)."""
    nvl = hardware_from_catalog("gb200", "gb200-nvl72")
    assert nvl.link(72) is nvl.server.scale_up and nvl.server.scale_up.bandwidth_bytes_per_s == 900e9
    hgx = hardware_from_catalog("b300", "hgx-b300")
    assert hgx.link(8) is hgx.server.scale_up and hgx.link(16) is hgx.server.scale_out
    assert hgx.server.scale_out.bandwidth_bytes_per_s == 100e9


def test_measured_source_maps_the_database_systems():
    m = mapping()
    assert {g: m["systems"][g] for g in ("b300", "gb200", "gb300")} == {"b300": "b300_sxm", "gb200": "gb200",
                                                                         "gb300": "gb300"}
    for g in ("b300", "gb200", "gb300"):
        assert m["servers"][g] == NEW[g]
    for g in ("h20", "l20", "a800-sxm-80gb"):  # not in the database: timed by the fitted roofline
        assert g not in m["systems"]


def test_fitted_factors_for_gpus_the_database_lacks():
    h20 = fitted_efficiency("h20", "vllm")
    assert "carried from the hopper GPUs" in h20.why
    a800 = fitted_efficiency("a800-sxm-80gb", "sglang")
    from optimizer.model.efficiency import _table

    assert "carried from the ampere GPUs" in a800.why and a800.compute == _table()["generations"]["ampere"]["compute"]
    l20 = fitted_efficiency("l20", "vllm")
    assert "no ada GPU" in l20.why and "not measured" in l20.why
    gens = [fitted_efficiency(g, "x") for g in ("h20", "a800-sxm-80gb", "b300")]
    assert 0 < l20.memory < 1 and min(x.memory for x in gens) <= l20.memory <= max(x.memory for x in gens)
    b300 = fitted_efficiency("b300", "vllm")  # in the database: its own fit
    assert "(b300, vllm" in b300.why


def _gb200_raw(source: str) -> dict:
    return {"name": "gb200 tp8", "model": {"config": str(INSTANCES / "models" / "qwen3-32b.json"), "hf_id": "Qwen/Qwen3-32B"},
            "hardware": {"gpu": "gb200", "server": "gb200-nvl72", "servers": 1},
            "serving": {"traffic": {"concurrency": 8, "isl": 1024, "osl": 128}, "slo": {"ttft_ms": 1e6, "tpot_ms": 1e6},
                        "fixed": {"workers": [{"role": "aggregated", "tp": 8, "count": 1}]}},
            "performance": {"source": source, "engine": "trtllm"}}


def test_a_tp8_worker_on_an_nvl72_rack_is_timed_by_the_database(cli_any, tmp_path):
    """Qwen3-32B TP8 on GB200 under ``measured`` (trtllm): the plan names the gb200 system."""
    r = cli_any("estimate", write(tmp_path, _gb200_raw("measured"), "g.yaml"))
    assert r.exit_code == 0, r.output
    assert "gb200" in r.output and "measured" in r.output


def test_supernode_ib_cluster_crosses_servers_over_the_nic(cli, tmp_path):
    """hgx-h100-ib: a 16-card size exceeds the 8-card NVLink domain (refused without
    allow_cross_server, one line), and with it is timed over the NIC."""
    import yaml

    raw = yaml.safe_load((INSTANCES / "supernode_deepseek_v3.yaml").read_text())
    raw["model"]["config"] = str(INSTANCES / "models" / "deepseek-v3.json")
    raw["supernode"] |= {"system": "hgx-h100-ib", "sizes": [16, 64]}
    from tests.conftest import assert_one_line_error

    assert_one_line_error(cli(write(tmp_path, raw, "ib.yaml")), "supernode.sizes[0]", "largest scale-up domain",
                          "(8 cards)", "allow_cross_server")
    raw["supernode"]["allow_cross_server"] = True
    r = cli(write(tmp_path, raw, "ib2.yaml"), "--format", "json")
    assert r.exit_code == 0, r.output
    import json

    fabrics = {i["fabric"] for i in json.loads(r.output)["plan"]["instances"]}
    assert fabrics and all("nic" in f.lower() or "cross" in f.lower() for f in fabrics), fabrics
