"""Random small deployment instances timed by the measured source (aiconfigurator-core's kernel
database): a real model on a catalog GPU in a small inline server, so that the exhaustive search
of :mod:`tests.deploy_helpers` stays small while every step comes from the database's tables."""
from __future__ import annotations

import random
from pathlib import Path

from optimizer.deployment.schema import build_problem
from tests.deploy_helpers import BATCHED_LAYOUTS, random_sessions

MODELS = Path(__file__).resolve().parents[1] / "instances" / "models"


def random_measured(seed: int, folder, model: str = "qwen3-30b-a3b", source: str = "auto",
                    deadlines=range(20, 200, 3)):
    """A random batched instance of ``model`` (BF16) on H100 SXM GPUs in a 2- or 4-GPU server:
    1-4 sessions of 1K-39K context and 2-6 new tokens, layouts drawn from TP1, TP2, TP1xDP2 and
    PP2, a batch limit of 2, 3 or none, timed by ``performance.source: source`` (vLLM)."""
    rng = random.Random(seed)
    gpus, servers = rng.choice([(2, 1), (4, 1), (2, 2)])
    sessions = random_sessions(rng, (1_000, 40_000), deadlines)
    layouts = list(BATCHED_LAYOUTS)
    raw = {
        "name": f"measured {seed}", "model": {"config": str(MODELS / f"{model}.json")},
        "hardware": {
            "gpu": "h100-sxm",
            "server": {"name": "box", "gpus": gpus, "power_kw": 2.0 * gpus,
                       "scale_up": {"bandwidth_gb_s": 450.0, "latency_us": 3.0},
                       "scale_out": {"bandwidth_gb_s": 50.0, "latency_us": 10.0}},
            "servers": servers},
        "workload": {"sessions": sessions, "min_on_time_fraction": rng.choice([0.0, 0.5, 1.0])},
        "deployment": {"reserve_gib_per_gpu": 2.0, "layouts": rng.sample(layouts, rng.randint(1, 4)),
                       "max_batch": rng.choice([2, 3, None])},
        "performance": {"source": source, "engine": "vllm"},
    }
    return build_problem(raw, Path(folder) / "measured.yaml")
