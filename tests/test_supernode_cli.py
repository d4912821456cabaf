"""The supernode CLI: bad input (exit 2, one line), infeasible (exit 3, named conflicts), output."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.conftest import shared
from tests.supernode_helpers import CHAPTER, SMALL_INVENTORY, run_cli, run_json, small_instance


def one_line_error(code, out, err, *needles, exit_code=2):
    assert code == exit_code, out + err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in out + err
    for n in needles:
        assert n in lines[0], lines[0]


def test_size_not_dividing_cards(tmp_path):
    p = small_instance(tmp_path, sizes=[4, 6])
    one_line_error(*run_cli(p), "inst.yaml", "supernode.sizes[1]", "size 6 does not divide the 16 cards")


def test_chapter_size_not_dividing_cards():
    shared("models", "deepseek-ai--DeepSeek-V4.1-Flash.inventory.yaml")
    one_line_error(*run_cli(CHAPTER, "--set", "supernode.sizes=[8,96]"), "supernode.sizes[1]", "96 does not divide")


def test_table_larger_than_every_tier(tmp_path):
    inv = copy.deepcopy(SMALL_INVENTORY)
    inv["engram"]["rows"] = [1_000_000_000]  # 500 GB
    p = small_instance(tmp_path, inventory=inv, table_tiers=["hbm", "host"])
    one_line_error(*run_cli(p), "supernode.table_tiers", "is larger than every tier it may use", "host 32.0 GB")


def test_inventory_missing_kv_bytes(tmp_path):
    inv = copy.deepcopy(SMALL_INVENTORY)
    del inv["kv"]["capacity_bytes"]
    p = small_instance(tmp_path, inventory=inv)
    one_line_error(*run_cli(p), "small.inventory.yaml", "kv.capacity_bytes", "required field is missing")


@pytest.mark.parametrize("change, needles", [
    ({"sizes": [4, 32]}, ["supernode.sizes[1]", "exceeds the largest scale-up domain"]),
    ({"table_tiers": ["hbm", "sram"]}, ["supernode.table_tiers", "tier 'sram' is not declared"]),
    ({"table_tiers": ["tape"]}, ["supernode.table_tiers", "unknown tier 'tape'"]),
    ({"table_tiers": {"nope": ["hbm"]}}, ["supernode.table_tiers.nope", "has no table"]),
    ({"kv_tiers": ["rom"]}, ["supernode.kv_tiers", "not 'rom'"]),
    ({"cards": 0}, ["supernode.cards"]),
    ({"colour": "red"}, ["supernode.colour", "unknown key"]),
    ({"system": "no-such"}, ["supernode.system", "unknown system 'no-such'"]),
])
def test_bad_instance_fields(tmp_path, change, needles):
    p = small_instance(tmp_path, **change)
    if change == {"sizes": [4, 32]}:
        raw = yaml.safe_load(p.read_text())
        raw["supernode"]["cards"] = 32
        raw["supernode"]["allow_cross_server"] = False
        p.write_text(yaml.safe_dump(raw))
    one_line_error(*run_cli(p), *needles)


def test_unknown_objective_and_cards_without_target(tmp_path):
    p = small_instance(tmp_path)
    one_line_error(*run_cli(p, "--objective", "speed"), "--objective", "unknown objective 'speed' for supernode")
    one_line_error(*run_cli(p, "--objective", "cards"), "supernode.target_sessions", "needs a target_sessions")


def test_model_config_missing_file(tmp_path):
    p = small_instance(tmp_path)
    raw = yaml.safe_load(p.read_text())
    raw["model"] = {"config": "x.json", "weight_dtype": "fp8"}
    p.write_text(yaml.safe_dump(raw))
    one_line_error(*run_cli(p), "model.config", "file not found")


def test_infeasible_slo_names_conflict(tmp_path):
    p = small_instance(tmp_path, slo_ms_per_token=0.5)
    code, d = run_json(p)
    assert code == 3
    assert d["status"] == "infeasible" and d["plan"] is None
    fams = {g["family"] for g in d["conflicts"]}
    assert fams == {"deploy", "slo"}
    assert any("over the 0.5 ms per token target" in g["detail"] for g in d["conflicts"])
    code, out, _ = run_cli(p)
    assert code == 3
    # the text lists the same two conflicting families as the JSON, and the target missed
    conflicts = out.split("Conflicting constraints:", 1)[1]
    assert "- deploy[at least one instance]:" in conflicts and "- slo:" in conflicts, out
    assert "over the 0.5 ms per token" in " ".join(conflicts.split()), out


def test_infeasible_target_names_cards_and_target(tmp_path):
    p = small_instance(tmp_path, target_sessions=25_000)  # the 16 cards hold at most 19,840
    code, d = run_json(p, "--objective", "cards")
    assert code == 3
    assert {c for g in d["conflicts"] for c in g["constraints"]} >= {"cards[total]", "target[sessions]"}


def test_output_dir_and_table(tmp_path):
    p = small_instance(tmp_path)
    code, out, err = run_cli(p, "--output", tmp_path / "out")
    assert code == 0 and err.strip() == f"wrote {tmp_path / 'out' / 'result.json'}"
    d = json.loads((tmp_path / "out" / "result.json").read_text())
    assert d["problem"] == "supernode" and d["status"] == "optimal"
    assert "memory[" in out or "slo[" in out
    assert "Binding limits" in out and "solver cp-sat: optimal" in out


@pytest.mark.parametrize("objective", ["throughput", "sessions", "single_user", "cards"])
def test_every_objective_runs(tmp_path, objective):
    p = small_instance(tmp_path, target_sessions=1000)
    code, d = run_json(p, "--objective", objective)
    assert code == 0, d
    assert d["status"] == "optimal" and d["objective"]["gap"] == 0
    assert d["plan"]["cards_used"] <= 16
    assert d["plan"]["sessions"] >= 1000


def _readme_supernode_commands():
    """The supernode commands of the documentation (docs/supernode.md; the README links there)."""
    import shlex

    from tests.supernode_helpers import REPO

    out = []
    for line in (REPO / "docs" / "supernode.md").read_text().splitlines():
        line = line.split(" #")[0].strip()
        if line.startswith(".venv/bin/optimize instances/supernode_"):
            out.append(shlex.split(line)[1:])
    return out


@pytest.mark.parametrize("parts", _readme_supernode_commands(), ids=lambda p: " ".join(p))
def test_readme_supernode_commands(parts):
    from tests.supernode_helpers import REPO

    shared("models", "deepseek-ai--DeepSeek-V4.1-Flash.inventory.yaml")
    code, out, err = run_cli(REPO / parts[0], *parts[1:])
    assert code == 0, out + err
    assert "optimal" in out and "Traceback" not in out


def test_readme_lists_supernode_commands():
    assert len(_readme_supernode_commands()) >= 4


@pytest.mark.parametrize("tiers,needle", [("[magic]", "unknown tier 'magic'"), ("[]", "no tier given")])
def test_table_tiers_are_checked_for_a_model_without_tables(tiers, needle):
    """A fresh user's ``table_tiers: [magic]`` on DeepSeek-V3 (no lookup tables) was accepted
    silently; the same list on a model with tables was refused."""
    from tests.conftest import INSTANCES

    one_line_error(*run_cli(INSTANCES / "supernode_deepseek_v3.yaml", "--set", f"supernode.table_tiers={tiers}"),
                   "supernode.table_tiers", needle)
