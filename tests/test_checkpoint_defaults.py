"""Defaults read from the checkpoint and the engine, never assumed (issue #38, point 4).

An instance without ``model.kv_dtype`` (or ``model.weight_dtype``) takes them from the model's
config.json ``quantization_config`` (or the hf_quant_config.json beside it) and from what the
instance's engine stores with its KV-cache option at ``auto`` (instances/engines/kv_defaults.yaml,
optimizer/model/checkpoint.py). An explicit field always wins; a malformed quantization config is
one line (file, field, problem) and exit 2.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from optimizer.model.checkpoint import RULES_FILE, resolve, rules
from tests.conftest import INSTANCES, assert_one_line_error

QWEN32B = json.loads((INSTANCES / "models" / "qwen3-32b.json").read_text())
V3 = json.loads((INSTANCES / "models" / "deepseek-v3.json").read_text())

FP8_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
FP8_GROUP = {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                         "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}

# quantization_config of each kind (None: none in config.json); "file": an hf_quant_config.json beside it
KINDS = {
    # ModelOpt, flat, a kv_cache_quant_algo name (the brief's example)
    "modelopt-kv-algo": ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, None),
    # ModelOpt >= 0.31 config.json form: a kv_cache_scheme mapping
    "modelopt-kv-scheme": ({"quant_method": "modelopt", "quant_algo": "FP8", "producer": {"name": "modelopt"},
                            "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}, None),
    # older ModelOpt export: no quantization_config, an hf_quant_config.json beside config.json
    "modelopt-hf-quant-file": (None, {"producer": {"name": "modelopt", "version": "0.23.0"},
                                      "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}),
    # llm-compressor (compressed-tensors) FP8 weights with a static per-tensor FP8 KV scheme
    "compressed-tensors-kv": ({"quant_method": "compressed-tensors", "config_groups": FP8_GROUP,
                               "kv_cache_scheme": FP8_SCHEME}, None),
    # Qwen/Qwen3-32B-FP8: block-scaled FP8 weights, no KV scheme
    "block-fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                   "weight_block_size": [128, 128]}, None),
    "none": (None, None),
}

# (kind, engine, version) -> (weight_dtype, kv_dtype), per the rules found in the engines' sources
EXPECTED = {
    ("modelopt-kv-algo", "vllm", "0.24.0"): ("fp8", "fp8"),
    ("modelopt-kv-algo", "vllm", "0.33.0"): ("fp8", "fp8"),
    ("modelopt-kv-algo", "sglang", "0.5.14"): ("fp8", "bf16"),  # 0.5.14 reads no flat kv_cache_quant_algo
    ("modelopt-kv-algo", "sglang", "0.5.16"): ("fp8", "fp8"),
    ("modelopt-kv-algo", "sglang", "0.5.23"): ("fp8", "fp8"),
    ("modelopt-kv-algo", "trtllm", None): ("fp8", "bf16"),  # its flat reader takes only kv_cache_scheme
    ("modelopt-kv-scheme", "vllm", "0.24.0"): ("fp8", "fp8"),
    ("modelopt-kv-scheme", "sglang", "0.5.14"): ("fp8", "fp8"),
    ("modelopt-kv-scheme", "sglang", "0.5.23"): ("fp8", "fp8"),
    ("modelopt-kv-scheme", "trtllm", None): ("fp8", "fp8"),
    ("modelopt-hf-quant-file", "vllm", "0.24.0"): ("fp8", "fp8"),
    ("modelopt-hf-quant-file", "sglang", "0.5.14"): ("fp8", "fp8"),
    ("modelopt-hf-quant-file", "trtllm", None): ("fp8", "fp8"),
    ("compressed-tensors-kv", "vllm", "0.24.0"): ("fp8", "fp8"),
    ("compressed-tensors-kv", "sglang", "0.5.14"): ("fp8", "bf16"),  # from 0.5.23
    ("compressed-tensors-kv", "sglang", "0.5.16"): ("fp8", "bf16"),
    ("compressed-tensors-kv", "sglang", "0.5.23"): ("fp8", "fp8"),
    ("compressed-tensors-kv", "trtllm", None): ("fp8", "fp8"),
    ("block-fp8", "vllm", "0.24.0"): ("fp8", "bf16"),
    ("block-fp8", "vllm", "0.33.0"): ("fp8", "bf16"),
    ("block-fp8", "sglang", "0.5.14"): ("fp8", "bf16"),
    ("block-fp8", "sglang", "0.5.23"): ("fp8", "bf16"),
    ("block-fp8", "trtllm", None): ("fp8", "bf16"),
    ("none", "vllm", "0.24.0"): ("bf16", "bf16"),
    ("none", "sglang", "0.5.14"): ("bf16", "bf16"),
    ("none", "trtllm", None): ("bf16", "bf16"),
}


def checkpoint(tmp_path: Path, kind: str, base: dict = QWEN32B) -> Path:
    """A checkpoint folder with ``config.json`` (and hf_quant_config.json) of ``kind``."""
    inline, file = KINDS[kind]
    d = tmp_path / kind
    d.mkdir(exist_ok=True)
    cfg = {k: v for k, v in base.items() if k != "quantization_config"}
    if inline is not None:
        cfg["quantization_config"] = copy.deepcopy(inline)
    (d / "config.json").write_text(json.dumps(cfg))
    if file is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(file))
    return d / "config.json"


@pytest.mark.parametrize("kind,engine,version", sorted(EXPECTED, key=str))
def test_each_kind_of_checkpoint_under_each_engine(tmp_path, kind, engine, version):
    d = resolve(checkpoint(tmp_path, kind), engine, version)
    assert (d.weight_dtype, d.kv_dtype) == EXPECTED[kind, engine, version], d
    assert d.weight_source and d.kv_source
    assert d.derived == (kind != "none")
    if kind != "none":
        assert engine in d.kv_source and "kv_defaults.yaml" in d.kv_source


def test_every_kind_and_engine_is_covered():
    """The expectation table covers every kind under every engine of the rule table."""
    assert {k for k, _, _ in EXPECTED} == set(KINDS)
    assert {e for _, e, _ in EXPECTED} == set(rules())
    for kind in KINDS:
        assert {e for k, e, _ in EXPECTED if k == kind} == set(rules()), kind


def test_every_rule_cites_its_source():
    table = yaml.safe_load(RULES_FILE.read_text())["engines"]
    for engine, t in table.items():
        assert t["auto"]["source"].strip() and t["checked"], engine
        for r in t["rules"]:
            assert r["source"].strip() and r["when"] and r["kv_dtype"], (engine, r)


def test_compressed_tensors_kv_scheme_is_not_applied_by_vllm_mla_layers(tmp_path):
    """vLLM applies a compressed-tensors kv_cache_scheme in its Attention layer only: an MLA
    model's cache stays in the model's dtype; SGLang 0.5.23 and TensorRT-LLM store FP8."""
    cfg = checkpoint(tmp_path, "compressed-tensors-kv", base=V3)
    assert resolve(cfg, "vllm", "0.24.0", mla=True).kv_dtype == "bf16"
    assert resolve(cfg, "sglang", "0.5.23", mla=True).kv_dtype == "fp8"
    assert resolve(cfg, "trtllm", None, mla=True).kv_dtype == "fp8"


def test_the_shipped_block_fp8_config_keeps_a_bf16_cache():
    """instances/models/deepseek-v3.json is block-FP8 (quant_method fp8) with no KV scheme: every
    engine keeps a BF16 cache; its weights are FP8 (the shipped instances name both anyway)."""
    for engine, version in (("vllm", "0.24.0"), ("sglang", "0.5.14"), ("trtllm", None)):
        d = resolve(INSTANCES / "models" / "deepseek-v3.json", engine, version, mla=True)
        assert (d.weight_dtype, d.kv_dtype) == ("fp8", "bf16")


# ---------------------------------------------------------------- through the problems' schemas
def _serving_raw(cfg: Path, **model) -> dict:
    return {"name": "ckpt", "model": {"config": str(cfg), "hf_id": "org/model", **model},
            "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": 1},
            "performance": {"source": "chapter"},
            "serving": {"traffic": {"rate_rps": 1.0, "isl": 1024, "osl": 128}, "slo": {"ttft_ms": 2000, "tpot_ms": 50},
                        "mode": "aggregated", "simulation": {"enabled": False}}}


def _deployment_raw(cfg: Path, **model) -> dict:
    raw = yaml.safe_load((INSTANCES / "qwen32b_128k.yaml").read_text())
    raw["model"] = {"config": str(cfg), "rope_scaling": raw["model"]["rope_scaling"], **model}
    return raw


def test_serving_and_deployment_take_the_checkpoint_and_engine_defaults(tmp_path):
    from optimizer.deployment.schema import build_problem
    from optimizer.serving import load_problem

    cfg = checkpoint(tmp_path, "modelopt-kv-algo")
    inst = tmp_path / "inst.yaml"
    sp = load_problem(_serving_raw(cfg), inst, None)  # performance.engine: vllm by default
    assert (sp.weight_dtype, sp.kv_dtype) == ("fp8", "fp8")
    assert sp.pools[0].perf.w.kv_bytes_per_token == pytest.approx(64 * 8 * 128 * 2 * 1.0)  # FP8: 1 byte
    raw = _serving_raw(cfg)
    raw["serving"]["engine"] = "sglang"  # times with SGLang 0.5.14 (launch default): flat kv_cache_quant_algo unread
    assert load_problem(raw, inst, None).kv_dtype == "bf16"
    raw["performance"]["engine"] = "sglang"  # the timing engine decides, as serving.engine would
    assert load_problem(raw, inst, None).kv_dtype == "bf16"
    dp = build_problem(_deployment_raw(cfg), inst)
    assert (dp.weight_dtype, dp.kv_dtype, dp.kv_bytes) == ("fp8", "fp8", 1.0)
    raw = _deployment_raw(cfg)
    raw["performance"] = {"source": "chapter", "engine": "trtllm"}
    assert build_problem(raw, inst).kv_dtype == "bf16"
    assert build_problem(_deployment_raw(checkpoint(tmp_path, "none")), inst).kv_dtype == "bf16"


def test_the_explicit_fields_win(tmp_path):
    from optimizer.deployment.schema import build_problem
    from optimizer.serving import load_problem

    cfg = checkpoint(tmp_path, "modelopt-kv-scheme")
    inst = tmp_path / "inst.yaml"
    sp = load_problem(_serving_raw(cfg, kv_dtype="bf16"), inst, None)
    assert (sp.weight_dtype, sp.kv_dtype) == ("fp8", "bf16")
    assert sp.dtypes.kv_source == "model.kv_dtype"
    sp = load_problem(_serving_raw(cfg, weight_dtype="bf16"), inst, None)
    assert (sp.weight_dtype, sp.kv_dtype) == ("bf16", "fp8")
    dp = build_problem(_deployment_raw(cfg, kv_dtype="bf16", weight_dtype="fp8"), inst)
    assert (dp.kv_dtype, dp.kv_bytes) == ("bf16", 2.0)
    # both given: the checkpoint's quantization config is not read (a broken one does not matter)
    bad = json.loads(cfg.read_text())
    bad["quantization_config"]["kv_cache_scheme"] = "FP9"
    cfg.write_text(json.dumps(bad))
    assert build_problem(_deployment_raw(cfg, kv_dtype="fp8", weight_dtype="fp8"), inst).kv_dtype == "fp8"


def test_the_json_and_text_say_where_the_dtypes_came_from(cli, tmp_path):
    cfg = checkpoint(tmp_path, "compressed-tensors-kv")
    inst = tmp_path / "inst.yaml"
    inst.write_text(yaml.safe_dump(_serving_raw(cfg)))
    r = cli(inst, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    dt = d["plan"]["dtypes"]
    assert dt["kv_dtype"] == "fp8" and "vllm 0.24.0" in dt["kv_dtype_source"] and "kv_defaults.yaml" in dt["kv_dtype_source"]
    assert dt["weight_dtype"] == "fp8" and "compressed-tensors" in dt["weight_dtype_source"]
    assert "dtypes" in d["definitions"]
    # a compressed-tensors checkpoint: the engines read its quantization, no --quantization fp8
    cmds = [c for rr in d["plan"]["rates"] for m in rr["modes"].values() for g in m.get("workers", [])
            for c in g["launch"].values()]
    assert cmds and not any("--quantization" in c for c in cmds) and all("--kv-cache-dtype" in c for c in cmds)
    r = cli(inst)
    assert r.exit_code == 0, r.output
    assert "dtypes: weights fp8" in r.stdout and "KV cache fp8" in r.stdout
    dep = tmp_path / "dep.yaml"
    dep.write_text(yaml.safe_dump(_deployment_raw(cfg)))
    r = cli(dep, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["model"]["dtypes"]["kv_dtype"] == "fp8" and "model.dtypes" in d["definitions"]
    # an unquantized checkpoint: the record is there, no text line (the output is as before)
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(_serving_raw(checkpoint(tmp_path, "none"))))
    r = cli(plain)
    assert r.exit_code == 0 and "dtypes:" not in r.stdout


def test_a_block_fp8_checkpoint_keeps_quantization_fp8_in_the_commands(cli, tmp_path):
    inst = tmp_path / "inst.yaml"
    inst.write_text(yaml.safe_dump(_serving_raw(checkpoint(tmp_path, "block-fp8"))))
    r = cli(inst, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    cmds = [c for rr in d["plan"]["rates"] for m in rr["modes"].values() for g in m.get("workers", [])
            for c in g["launch"].values()]
    assert cmds and all("--quantization fp8" in c and "--kv-cache-dtype" not in c for c in cmds)


# ---------------------------------------------------------------- bad input: one line, exit 2
@pytest.mark.parametrize("qc,field,problem", [
    ("fp8", "quantization_config", "expected a mapping"),
    ({"quant_method": 7}, "quantization_config.quant_method", "expected a name"),
    ({"weight_block_size": [128, 128]}, "quantization_config.quant_method", "missing"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP9"},
     "quantization_config.kv_cache_quant_algo", "unknown KV-cache quantization 'FP9'"),
    ({"quant_method": "compressed-tensors", "config_groups": FP8_GROUP, "kv_cache_scheme": {"num_bits": "8", "type": "float"}},
     "quantization_config.kv_cache_scheme", "expected num_bits (an integer)"),
    ({"quant_method": "compressed-tensors", "config_groups": FP8_GROUP, "kv_cache_scheme": {"num_bits": 3, "type": "int"}},
     "quantization_config.kv_cache_scheme", "3-bit int KV cache"),
    ({"quant_method": "compressed-tensors", "config_groups": FP8_GROUP, "kv_cache_scheme": [8]},
     "quantization_config.kv_cache_scheme", "expected a mapping"),
    ({"quant_method": "compressed-tensors"}, "quantization_config.config_groups", "expected a mapping"),
    ({"quant_method": "modelopt", "kv_cache_quant_algo": "FP8", "producer": {"name": "modelopt"}},
     "quantization_config.quant_algo", "expected ModelOpt's quantization name"),
], ids=["not-a-mapping", "quant-method-type", "no-quant-method", "unknown-kv-algo", "kv-bits-type", "kv-bits",
        "kv-scheme-type", "no-config-groups", "no-quant-algo"])
def test_a_malformed_quantization_config_is_one_line(cli, tmp_path, qc, field, problem):
    d = tmp_path / "ckpt"
    d.mkdir()
    cfg = d / "config.json"
    cfg.write_text(json.dumps({**QWEN32B, "quantization_config": qc}))
    for raw in (_serving_raw(cfg), _deployment_raw(cfg)):
        inst = tmp_path / "inst.yaml"
        inst.write_text(yaml.safe_dump(raw))
        assert_one_line_error(cli(inst), str(cfg), field, problem)


def test_a_malformed_hf_quant_config_file_is_one_line(cli, tmp_path):
    cfg = checkpoint(tmp_path, "modelopt-hf-quant-file")
    (cfg.parent / "hf_quant_config.json").write_text("{\"quantization\": ")
    inst = tmp_path / "inst.yaml"
    inst.write_text(yaml.safe_dump(_serving_raw(cfg)))
    assert_one_line_error(cli(inst), "hf_quant_config.json", "not valid JSON")


def test_weights_of_mixed_dtypes_ask_for_model_weight_dtype(cli, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    cfg = d / "config.json"
    cfg.write_text(json.dumps({**QWEN32B, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}}))
    inst = tmp_path / "inst.yaml"
    inst.write_text(yaml.safe_dump(_serving_raw(cfg)))
    assert_one_line_error(cli(inst), str(inst), "model.weight_dtype", "MIXED_PRECISION")
    inst.write_text(yaml.safe_dump(_serving_raw(cfg, weight_dtype="fp4")))
    r = cli(inst, "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["plan"]["dtypes"]["kv_dtype"] == "fp8"
