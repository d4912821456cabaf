"""Launch commands per worker group for vLLM (``vllm serve``) and SGLang (``sglang.launch_server``).

Flag meanings as the engines document them: vLLM ``--tensor-parallel-size`` (attention and
dense TP), ``--data-parallel-size`` (DP attention ranks), ``--enable-expert-parallel`` (experts
spread over TP x DP GPUs), ``--max-num-seqs`` (running requests), ``--max-num-batched-tokens``
(chunked-prefill budget per step), ``--kv-transfer-config`` with the NIXL connector for
disaggregated prefill; SGLang ``--tp`` (GPUs of the worker), ``--dp`` with
``--enable-dp-attention`` (attention DP inside the TP group), ``--ep-size``,
``--max-running-requests``, ``--chunked-prefill-size``, ``--disaggregation-mode prefill|decode``
with ``--disaggregation-transfer-backend``; both ``--quantization fp8`` for FP8 weights (vLLM
quantizes a BF16 checkpoint online, its FP8 docs). INT4 weights need a 4-bit checkpoint
(AWQ/GPTQ) as MODEL, whose quantization the engines read from it (a note in the report). A
disaggregated deployment also needs the engine's router in front (vLLM's proxy example,
SGLang's router), not generated here.
"""
from __future__ import annotations

import shlex

from optimizer.serving.perf import Worker
from optimizer.serving.schema import Problem


def vllm(p: Problem, w: Worker, port: int = 8000) -> str:
    lay = w.layout
    args = ["vllm", "serve", p.hf_id, "--tensor-parallel-size", str(lay.attention_tp)]
    if lay.attention_dp > 1:
        args += ["--data-parallel-size", str(lay.attention_dp)]
    if p.model.moe is not None and lay.experts_ep > 1:
        args += ["--enable-expert-parallel"]
    if w.role != "prefill":
        args += ["--max-num-seqs", str(max(1, w.max_batch))]
    if w.role == "aggregated":
        args += ["--max-num-batched-tokens", str(p.chunk_tokens)]
    if p.weight_dtype == "fp8":  # online FP8 quantization of a BF16 checkpoint (or an FP8 checkpoint as it is)
        args += ["--quantization", "fp8"]
    if p.kv_dtype in ("fp8",):
        args += ["--kv-cache-dtype", "fp8"]
    if w.role in ("prefill", "decode"):
        args += ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    args += ["--port", str(port)]
    return shlex.join(args)


def sglang(p: Problem, w: Worker, port: int = 30000) -> str:
    lay = w.layout
    args = ["python", "-m", "sglang.launch_server", "--model-path", p.hf_id, "--tp", str(lay.gpus)]
    if lay.attention_dp > 1:
        args += ["--dp", str(lay.attention_dp), "--enable-dp-attention"]
    if p.model.moe is not None and lay.experts_ep > 1:
        args += ["--ep-size", str(lay.experts_ep)]
    if w.role != "prefill":
        args += ["--max-running-requests", str(max(1, w.max_batch))]
    args += ["--chunked-prefill-size", str(p.chunk_tokens)]
    if p.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
    if p.kv_dtype in ("fp8",):
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    if w.role in ("prefill", "decode"):
        args += ["--disaggregation-mode", w.role, "--disaggregation-transfer-backend", "nixl"]
    args += ["--port", str(port)]
    return shlex.join(args)


def commands(p: Problem, w: Worker) -> dict[str, str]:
    """``{engine: command}`` for the engines asked (``serving.engine``)."""
    out = {}
    if p.engine in ("vllm", "both"):
        out["vllm"] = vllm(p, w)
    if p.engine in ("sglang", "both"):
        out["sglang"] = sglang(p, w)
    return out
