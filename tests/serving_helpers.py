"""Helpers for serving tests: instance dicts written next to the repo's model configs."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
INSTANCES = REPO / "instances"


def qwen32b_raw(bandwidth_gb_s: float = 50.0, ttft_ms: float = 4300.0, mode: str = "both", rate: float = 0.001,
                simulate: bool = False) -> dict:
    """Qwen3-32B, 32,768-token prompts, TP1 prefill workers (the issue's KV-link case)."""
    return {
        "name": "qwen3-32b 32K prompts",
        "model": {"config": "models/qwen3-32b.json", "hf_id": "Qwen/Qwen3-32B"},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": 4,
                     "kv_link": {"bandwidth_gb_s": bandwidth_gb_s, "latency_us": 3.76}},
        "performance": {"source": "chapter"},
        "serving": {"traffic": {"rate_rps": rate, "isl": 32768, "osl": 128},
                    "slo": {"ttft_ms": ttft_ms, "tpot_ms": 100}, "mode": mode, "kv_transfer": "request",
                    "prefill": {"tp": [1]}, "simulation": {"enabled": simulate, "requests": 200}},
    }


def llama70b_raw(**serving) -> dict:
    raw = yaml.safe_load((INSTANCES / "serving_llama70b_h100.yaml").read_text())
    raw["serving"].update(serving)
    return raw


def llama8b_raw(rate: float, isl: int, osl: int, ttft_ms: float, tpot_ms: float, servers: int = 1, mode: str = "both") -> dict:
    return {
        "name": "llama-3.1-8b small",
        "model": {"config": "models/llama-3.1-8b.json"},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "performance": {"source": "chapter"},
        "serving": {"traffic": {"rate_rps": rate, "isl": isl, "osl": osl},
                    "slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms}, "mode": mode,
                    "simulation": {"enabled": False}},
    }


def write(tmp_path: Path, raw: dict, name: str = "inst.yaml") -> Path:
    """Write ``raw`` into ``instances/`` semantics: model paths are made absolute."""
    raw = copy.deepcopy(raw)
    cfg = Path(raw["model"]["config"])
    if not cfg.is_absolute():
        raw["model"]["config"] = str(INSTANCES / cfg)
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def problem(raw: dict, objective: str | None = None):
    from optimizer.serving import load_problem

    return load_problem(raw, INSTANCES / "test.yaml", objective)
