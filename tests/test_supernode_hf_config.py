"""Supernode sizing from a HuggingFace config (DeepSeek-V3, FP8 weights): the decode inventory
comes from the shared model (optimizer.model), and the per-card figures follow eq 6-14."""
from __future__ import annotations

import json

import pytest

from optimizer.model.decode import decode_inventory
from tests.conftest import INSTANCES, assert_one_line_error

INSTANCE = INSTANCES / "supernode_deepseek_v3.yaml"
GB, GIB = 1e9, 2 ** 30


def test_deepseek_v3_from_its_config(cli):
    r = cli(INSTANCE, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    inv = decode_inventory(INSTANCES / "models" / "deepseek-v3.json", "fp8", "bf16")
    # MLA KV per token at bf16 (chapter): (512 + 64) x 61 layers x 2 B
    assert inv.kv_capacity_bytes.per_context_token == pytest.approx(70_272)
    (inst,) = d["plan"]["instances"]
    s = inst["size"]
    w_card = inv.replicated_resident_bytes + inv.routed_bytes / s  # eq 6-14, no tables
    assert inst["weights_per_card_gb"] == pytest.approx(w_card / GB, abs=1e-6)  # the JSON keeps 6 decimals
    k = inv.kv_capacity_bytes.at(32_768)
    n = int((80 * GB - w_card - 2 * GIB) // k)  # eq 6-1 / 6-14: N = floor((C - W_card - U) / K)
    assert inst["sessions_per_card"] <= n
    assert d["status"] == "optimal"
    # S = 8 cannot hold the weights: replicated + routed/8 > 80 GB
    assert inv.replicated_resident_bytes + inv.routed_bytes / 8 > 80 * GB
    row8 = next(a for a in d["alternatives"] if a["size"] == 8)
    assert row8["feasible"] is False


def test_bad_dtype_names_the_instance_field(cli, tmp_path):
    p = tmp_path / "v3.yaml"
    p.write_text(INSTANCE.read_text().replace("config: models/deepseek-v3.json",
                                              f"config: {INSTANCES / 'models' / 'deepseek-v3.json'}")
                 .replace("weight_dtype: fp8", "weight_dtype: fp7"))
    assert_one_line_error(cli(p), "v3.yaml", "model.weight_dtype", "fp7")
