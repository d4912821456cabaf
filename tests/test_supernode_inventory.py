"""The inventory-file reader: the shared DeepSeek-V4.1-Flash file, and strict one-line errors."""
from __future__ import annotations

import copy

import pytest
import yaml

from optimizer.errors import InputError
from optimizer.model.inventory_file import read_inventory
from tests.conftest import shared
from tests.supernode_helpers import SMALL_INVENTORY


def _write(tmp_path, data, name="inv.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_reads_v41_flash():
    inv = read_inventory(shared("models", "deepseek-ai--DeepSeek-V4.1-Flash.inventory.yaml"))
    assert inv.layers == 40 and inv.moe_layers == 40 and inv.hidden == 5120
    assert inv.routed_experts == 384 and inv.experts_per_token == 6
    assert inv.routed_bytes == 40 * 384 * 18800640
    assert inv.replicated_read_bytes == 8207877568
    assert [t.layer for t in inv.tables] == [1, 14]
    assert [t.rows_per_token for t in inv.tables] == [24, 24]
    assert inv.table_bytes == 202758032400
    assert inv.table_extra_bytes == 315043840
    assert inv.kv_capacity_bytes.at(200000) == 2703360 + 890 * 200000
    assert inv.kv_read_bytes.at(200000) == 12763136 + 170 * 200000
    assert inv.flops_per_token.at(0) == 36019273952
    assert inv.max_context == 1048576


def test_reads_small(tmp_path):
    inv = read_inventory(_write(tmp_path, SMALL_INVENTORY))
    assert inv.moe_layers == 4  # defaults to layers
    assert inv.tables[0].bytes == 5e9
    assert inv.max_context is None


def _mutate(path_parts, value=None, delete=False):
    d = copy.deepcopy(SMALL_INVENTORY)
    node = d
    for k in path_parts[:-1]:
        node = node[k]
    if delete:
        del node[path_parts[-1]]
    else:
        node[path_parts[-1]] = value
    return d


@pytest.mark.parametrize("parts, value, delete, field, words", [
    (("kv", "read_bytes_per_step"), None, True, "kv.read_bytes_per_step", "required field is missing"),
    (("kv",), None, True, "kv", "required field is missing"),
    (("kv", "capacity_bytes", "per_context_token"), -1, False, "kv.capacity_bytes.per_context_token", "non-negative"),
    (("experts", "routed_bytes"), 123, False, "experts.routed_bytes", "is not moe_layers x routed x expert_bytes"),
    (("weights", "replicated_read_bytes"), "lots", False, "weights.replicated_read_bytes", "expected a number"),
    (("engram", "rows"), [1, 2], False, "engram.rows", "expected 1 values"),
    (("engram", "layers"), [9], False, "engram.layers[0]", "outside the model's 4 layers"),
    (("colour",), "blue", False, "colour", "unknown key"),
    (("experts", "per_token"), 99, False, "experts.per_token", "exceeds experts.routed"),
])
def test_bad_inventory_one_line(tmp_path, parts, value, delete, field, words):
    p = _write(tmp_path, _mutate(parts, value, delete))
    with pytest.raises(InputError) as e:
        read_inventory(p)
    line = e.value.line()
    assert "\n" not in line
    assert str(p) in line and field in line and words in line, line


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        read_inventory(tmp_path / "nope.yaml")
