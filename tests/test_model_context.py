"""Context limit (issue: a session longer than the model's maximum length is refused, exit 2,
one line naming both numbers); the maximum is derived as vLLM derives ``max_model_len``."""
from __future__ import annotations

import pytest

from optimizer.deployment import load
from tests.conftest import INSTANCES, assert_one_line_error

BOOK = INSTANCES / "qwen32b_128k.yaml"
LLAMA = INSTANCES / "llama8b_mixed_h200.yaml"


def test_llama_400k_session_refused(cli):
    r = cli(LLAMA, "--set", "workload.sessions.0.context_tokens=400000")
    assert_one_line_error(r, "workload.sessions[0].context_tokens", "400128", "131072")


def test_book_instance_declares_yarn_for_131k():
    p = load(BOOK)
    assert p.model.max_context == 131072
    assert "YaRN" in p.model.max_context_source
    assert max(c.context + c.new for c in p.classes) == 131072  # exactly at the limit: accepted


def test_qwen_131k_without_rope_scaling_refused(cli):
    r = cli(BOOK, "--set", "model.rope_scaling=null")
    assert_one_line_error(r, "131072", "40960", "rope_scaling")


def test_context_plus_new_tokens_must_fit(cli):
    r = cli(BOOK, "--set", "workload.sessions.0.new_tokens=9")
    assert_one_line_error(r, "131073", "131072")


def test_yarn_without_original_length_is_bad_input(cli):
    r = cli(BOOK, "--set", "model.rope_scaling={rope_type: yarn, factor: 4}")
    assert_one_line_error(r, "model.rope_scaling.original_max_position_embeddings")


def test_unknown_rope_type_is_bad_input(cli):
    r = cli(BOOK, "--set", "model.rope_scaling={rope_type: ntk, factor: 4}")
    assert_one_line_error(r, "model.rope_scaling.rope_type")


@pytest.mark.parametrize("rope,limit", [
    ({"rope_type": "linear", "factor": 2}, 81920),
    ({"rope_type": "llama3", "factor": 8}, 40960),  # llama3 keeps max_position_embeddings
])
def test_other_rope_types(tmp_path, rope, limit):
    import yaml

    raw = yaml.safe_load(BOOK.read_text())
    raw["model"]["rope_scaling"] = rope
    raw["model"]["config"] = str(INSTANCES / "models" / "qwen3-32b.json")
    raw["workload"]["sessions"][0]["context_tokens"] = 1000
    p = tmp_path / "i.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert load(p).model.max_context == limit


def test_json_report_has_the_model_block(cli):
    import json

    r = cli(BOOK, "--format", "json")
    assert r.exit_code == 0
    m = json.loads(r.stdout)["model"]
    assert m["kv_bytes_per_token"] == 256 * 1024 and m["max_context"] == 131072
    assert m["weight_bytes"] / 1e9 == pytest.approx(65.52, abs=0.005)  # the chapter's resident bytes
    assert sum(c["params"] for c in m["components"].values()) == m["params"] == m["active_params_per_token"]
