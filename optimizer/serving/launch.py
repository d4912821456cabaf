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

Context-parallel prefill workers (``cp > 1``), checked against the engines' argument parsers at
the versions the measured database names (vLLM 0.24.0, SGLang 0.5.14; the released wheels):

* SGLang 0.5.14 (``sglang/srt/server_args.py``): ``--attn-cp-size C --enable-prefill-cp
  --cp-strategy zigzag``, ``--tp`` the world size (``tp % (dp x attn_cp) == 0``, attention TP =
  tp/(dp x cp)); its dense-attention CP path (CP v2, ``SGLANG_ENABLE_CP_V2``, on by default only
  for ``Qwen3MoeForCausalLM`` in ``sglang/srt/layers/cp/utils.py``) all-gathers each layer's K/V
  and keeps the whole KV on every rank, so the command sets ``SGLANG_ENABLE_CP_V2=1`` and the
  plan is timed with ``serving.cp_kv_exchange: allgather`` by default; its dense MLP uses the
  global TP group (the worker's GPUs), timed with ``serving.cp_ffn: worker`` by default; ``--chunked-prefill-size
  -1`` (no chunking: the whole prompt is split over the CP ranks in one pass, as timed).
* vLLM 0.24.0 has ``--prefill-context-parallel-size`` (``-pcp``, ``vllm/engine/arg_utils.py``;
  world size ``pp x tp x pcp``), but no attention backend in the release declares PCP support
  (``supports_pcp`` is False on every implementation; ``vllm/v1/worker/cp_utils.py`` asserts it at
  start-up), so no vLLM command is printed for a CP worker: the plan says so instead
  (:func:`launch_notes`).
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


VLLM_CP = ("vLLM 0.24.0 has --prefill-context-parallel-size but no attention backend in that release supports "
           "it (supports_pcp is False on every implementation; vllm/v1/worker/cp_utils.py asserts it at start-up): "
           "no vLLM command for the CP prefill workers; use the SGLang one")


def sglang(p: Problem, w: Worker, port: int = 30000) -> str:
    lay = w.layout
    args = ["python", "-m", "sglang.launch_server", "--model-path", p.hf_id, "--tp", str(lay.gpus)]
    if lay.cp > 1:  # SGLang 0.5.14 server_args: --attn-cp-size, --enable-prefill-cp, --cp-strategy {zigzag,interleave}
        args = ["env", "SGLANG_ENABLE_CP_V2=1"] + args + ["--attn-cp-size", str(lay.cp), "--enable-prefill-cp",
                                                        "--cp-strategy", "zigzag"]
    if lay.attention_dp > 1:
        args += ["--dp", str(lay.attention_dp), "--enable-dp-attention"]
    if p.model.moe is not None and lay.experts_ep > 1:
        args += ["--ep-size", str(lay.experts_ep)]
    if w.role != "prefill":
        args += ["--max-running-requests", str(max(1, w.max_batch))]
    # a CP worker prefills the whole prompt in one pass, as prefill_terms times it (-1: no chunking, SGLang 0.5.14)
    args += ["--chunked-prefill-size", "-1" if lay.cp > 1 else str(p.chunk_tokens)]
    if p.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
    if p.kv_dtype in ("fp8",):
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    if w.role in ("prefill", "decode"):
        args += ["--disaggregation-mode", w.role, "--disaggregation-transfer-backend", "nixl"]
    args += ["--port", str(port)]
    return shlex.join(args)


def launch_notes(p: Problem, w: Worker) -> list[str]:
    """What the plan says instead of a command an engine cannot run (a CP worker under vLLM 0.24.0)."""
    return [VLLM_CP] if w.layout.cp > 1 and p.engine in ("vllm", "both") else []


def commands(p: Problem, w: Worker) -> dict[str, str]:
    """``{engine: command}`` for the engines asked (``serving.engine``) that can run the worker
    (no vLLM command for a context-parallel worker, :func:`launch_notes`)."""
    out = {}
    if p.engine in ("vllm", "both") and w.layout.cp == 1:
        out["vllm"] = vllm(p, w)
    if p.engine in ("sglang", "both"):
        out["sglang"] = sglang(p, w)
    return out
