"""Bad input names its cause: a misspelt section or field is an unknown key, not the missing
field it leaves behind (a fresh user's findings: ``servng:`` read as ``workload: required
field is missing``, ``kv_link.bandwidth`` as ``bandwidth_gb_s: required field is missing``)."""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import assert_one_line_error

REPO = Path(__file__).resolve().parents[1]


def _copy(tmp_path, name: str, old: str, new: str) -> Path:
    src = (REPO / "instances" / name).read_text()
    assert old in src
    shutil.copytree(REPO / "instances" / "models", tmp_path / "models")
    p = tmp_path / name
    p.write_text(src.replace(old, new, 1))
    return p


def test_misspelt_section_is_named(cli, tmp_path):
    p = _copy(tmp_path, "serving_llama70b_h100.yaml", "\nserving:", "\nservng:")
    assert_one_line_error(cli(p), str(p), "servng", "unknown top-level key", "serving")


def test_misspelt_field_is_an_unknown_key(cli, tmp_path):
    p = _copy(tmp_path, "serving_qwen3_32b_slow_link.yaml", "bandwidth_gb_s: 5", "bandwidth: 5")
    assert_one_line_error(cli(p), str(p), "kv_link.bandwidth", "unknown key")


def test_percentile_as_a_fraction_is_refused(cli, tmp_path):
    p = _copy(tmp_path, "serving_llama70b_h100.yaml", "percentile: 90", "percentile: 0.9")
    assert_one_line_error(cli(p), str(p), "serving.slo.percentile")


def test_prefix_longer_than_the_prompt_is_refused(cli, tmp_path):
    """A 5,000-token shared prefix on 4,096-token prompts was clamped to the prompt silently."""
    import yaml

    raw = yaml.safe_load((REPO / "instances" / "serving_llama70b_h100.yaml").read_text())
    isl = min(c["isl"] for c in raw["serving"]["traffic"]["classes"]) if "classes" in raw["serving"]["traffic"] \
        else raw["serving"]["traffic"]["isl"]
    raw["serving"]["traffic"].update({"prefix_tokens": isl, "cache_hit_rate": 0.9})
    shutil.copytree(REPO / "instances" / "models", tmp_path / "models")
    p = tmp_path / "prefix.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert_one_line_error(cli(p), str(p), "serving.traffic.prefix_tokens", "shortest prompt")
