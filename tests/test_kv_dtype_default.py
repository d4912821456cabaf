"""One KV-cache dtype default for every problem (issue #27): BF16 for an unquantized checkpoint unless
kv_dtype is given, whatever the weights. (Issue #38: a quantized checkpoint's default is read from
it and the engine, tests/test_checkpoint_defaults.py.)"""
from __future__ import annotations

from optimizer.model.decode import DEFAULT_KV_DTYPE
from tests.conftest import INSTANCES as INSTANCES_DIR


def test_serving_deployment_and_supernode_default_to_the_same_kv_dtype():
    from optimizer.deployment.schema import ModelIn as DeployModelIn
    from tests.serving_helpers import llama8b_raw, problem

    assert DEFAULT_KV_DTYPE == "bf16"
    raw = llama8b_raw(1.0, 1024, 128, 1000, 50)
    raw["model"]["weight_dtype"] = "fp8"
    assert problem(raw).kv_dtype == DEFAULT_KV_DTYPE
    assert DeployModelIn.model_fields["kv_dtype"].default is None  # read from the checkpoint and engine
    import yaml
    from optimizer.deployment.schema import build_problem

    inst = INSTANCES_DIR / "qwen32b_128k.yaml"
    dep = yaml.safe_load(inst.read_text())
    dep["model"].pop("kv_dtype", None)
    dep["model"]["weight_dtype"] = "fp8"  # an unquantized checkpoint (models/qwen3-32b.json), FP8 weights
    assert build_problem(dep, inst).kv_dtype == DEFAULT_KV_DTYPE
    from optimizer.model.decode import decode_inventory
    from tests.serving_helpers import INSTANCES

    cfg = INSTANCES / "models" / "llama-3.1-8b.json"
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 bytes per token with FP8 weights too
    assert decode_inventory(cfg, "fp8").kv_capacity_bytes.per_context_token == 131072
