"""Launch commands per worker for vLLM (``vllm serve``) and SGLang (``sglang.launch_server``).

The engine-independent parts (flag lists, :class:`Launch`, the layout's parallel flags, the memory
fractions) are :mod:`optimizer.launch`, shared with the deployment problem's commands.

A command is built by a list of steps per engine (:data:`STEPS`; each step adds flags and
environment variables to a :class:`Launch`); a later feature (speculative decoding, say) adds
its step with :func:`add_step`. Every flag printed is checked against the flag list of the engine
version named (``instances/engines/<engine>-<version>.yaml``, read from that release's argument
parser by ``instances/engines/extract_flags.py``): a flag the version does not have is a
programming error (:class:`UnknownFlag`). The version is ``performance.engine_version`` for the
engine the plan was measured with, else the measured database's current one (:data:`DEFAULT_VERSION`).

Flag meanings, as the engines' parsers and docs give them:

* vLLM ``--tensor-parallel-size`` (attention and dense TP), ``--data-parallel-size`` (DP
  attention ranks), ``--enable-expert-parallel`` (experts spread over TP x DP GPUs),
  ``--max-num-seqs`` (running requests **per DP rank**: each DP engine core has its own scheduler,
  ``SchedulerConfig.max_num_seqs``; the plan's batch divided by the DP ranks, rounded up),
  ``--max-num-batched-tokens`` (chunked-prefill budget per step and DP rank, the plan's
  ``chunk_tokens``), ``--kv-transfer-config`` with the NIXL connector for disaggregated prefill;
  NIXL's handshake listens on ``VLLM_NIXL_SIDE_CHANNEL_HOST``:``VLLM_NIXL_SIDE_CHANNEL_PORT``
  (``vllm/envs.py``; defaults ``localhost``, 5600; each DP rank takes base + dp_rank, vLLM's
  ``docs/features/nixl_connector_usage.md``), over the NICs of ``UCX_NET_DEVICES``.
* SGLang ``--tp-size`` (the worker's GPUs; ``--tp`` is only argparse's abbreviation of it),
  attention DP ``--dp-size N --enable-dp-attention`` up to 0.5.16, ``--attn-dp-size N`` from 0.5.23
  (which deprecates the former; the flag list decides), ``--ep-size``, ``--max-running-requests``
  (the worker's total: SGLang divides it by the attention-DP size itself,
  ``pool_configurator.py``), ``--chunked-prefill-size`` (divided by the attention-DP size at
  start-up, ``server_args.py`` ``_handle_data_parallelism``: the command prints the plan's
  per-rank ``chunk_tokens`` x DP), ``--disaggregation-mode prefill|decode`` with
  ``--disaggregation-transfer-backend nixl``, the prefill side's bootstrap server on
  ``--disaggregation-bootstrap-port`` (default 8998) and its NICs ``--disaggregation-ib-device``;
  ``--host 0.0.0.0`` (default 127.0.0.1) so a router on another server reaches it.
* Both ``--quantization fp8`` for FP8 weights (vLLM quantizes a BF16 checkpoint online, its FP8
  docs). INT4 weights need a 4-bit checkpoint (AWQ/GPTQ) as MODEL, whose quantization the engines
  read from it (a note in the report).

Memory (:func:`memory_plan`): the engine must start with a KV pool at least as large as the plan
assumed, and with the longest request of the traffic as its context limit:

* ``--max-model-len`` / ``--context-length`` = the traffic's longest request (``isl + osl``,
  ``Traffic.max_len``), not the model's default (131,072 for Llama-3.1: a TP2 70B BF16 prefill
  worker holds about 25K tokens of KV at vLLM's default 0.92 and vLLM refuses to start).
* KV the plan assumed per GPU, ``kv``: the worker's batch per DP rank at the mean request length
  (decode, aggregated: ``ceil(max_batch / dp)`` requests of ``ceil(mean isl) + ceil(mean osl)``
  tokens, as eq. 6-1 sized it) and at least one longest request; prefill: its prompts in flight
  per rank (one) at the longest length. Bytes from :meth:`PerfModel.kv_bytes_per_gpu`.
* vLLM ``--gpu-memory-utilization U = ceil_0.01((weights + reserve + kv) / memory)``, at most 1:
  vLLM's budget ``U x memory`` holds weights, the profiled activations, non-torch memory and CUDA
  graphs as well as the KV (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``:
  KV = requested - non-KV - CUDA-graph estimate), which the plan's ``serving.reserve_gib_per_gpu``
  stands for. At most ``floor_0.01((memory - reserve) / memory)``: vLLM refuses to start when
  less than ``U x memory`` is free (``request_memory``), and the CUDA context is not free; a worker
  whose plan fills the GPU (``limited_by kv_memory``) then gets that cap and a note that its KV pool
  is smaller than planned by what vLLM profiles inside its budget (raise ``serving.reserve_gib_per_gpu``).
* SGLang ``--mem-fraction-static f = ceil_0.01((weights + kv) / memory)``: its static pool is the
  weights and the KV only (``server_args.py`` help), activations live in the rest, ``>=`` the reserve.
* Under ``performance.source: measured`` the plan's KV capacity came from that engine's memory
  fraction (``performance.memory_fraction`` or the engine version's default, as
  aiconfigurator-core records it): the engine's command prints that fraction.

Two-batch overlap (``serving.micro_batches: 2``) on decode and aggregated workers and sequence
parallelism (``serving.<role>.sp``) on SP layouts: :func:`optimizer.launch.overlap_args` and
:func:`optimizer.launch.sp_args` (flags where the engine version has them and runs them for the
layout, else a launch note).

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

import math
from dataclasses import dataclass
from typing import Callable, Optional

from optimizer.launch import (DEFAULT_PORT, DEFAULT_VERSION, ENGINES_DIR, HEAD as _HEAD, VLLM_CP, Launch,  # noqa: F401
                              Nodes, UnknownFlag, dtype_args, flag_list, layout_note,
                              memory_fractions, overlap_args, parallel_args, sp_args)
from optimizer.serving.perf import Worker
from optimizer.serving.schema import Problem

# the engine-independent parts (flag lists, Launch, the layout's flags, memory fractions) live in
# optimizer.launch, shared with the deployment problem; the names stay importable from here
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM VLLM_NIXL_SIDE_CHANNEL_PORT default (base + dp_rank)
BOOTSTRAP_PORT = 8998  # SGLang --disaggregation-bootstrap-port default
NIC_VARIABLE = "KV_NICS"  # the RDMA NICs of a server (e.g. mlx5_0,mlx5_1): the user sets it


def engine_version(p: Problem, engine: str) -> str:
    """The version a command is for: ``performance.engine_version`` when ``performance.engine`` is
    this engine, else the measured database's current version (:data:`DEFAULT_VERSION`)."""
    perf = p.performance
    if perf is not None and perf.engine == engine and perf.engine_version:
        return perf.engine_version
    return DEFAULT_VERSION[engine]


@dataclass
class Endpoint:
    """Where one worker listens: its HTTP ``port``, the NIXL side-channel base port (vLLM, one per DP
    rank from it) or the bootstrap port (SGLang prefill), and its server's address (a shell
    variable such as ``${SERVER_0_HOST}``). Multi-server workers: ``nodes`` servers, this script's
    ``node_rank`` and the first server's address ``head_host``."""

    port: Optional[int] = None
    side_port: int = NIXL_SIDE_CHANNEL_PORT
    bootstrap_port: int = BOOTSTRAP_PORT
    host: str = "${SERVER_HOST}"
    nodes: int = 1
    node_rank: int = 0
    head_host: str = "${SERVER_HOST}"
    dist_port: int = 29500


def memory_plan(p: Problem, w: Worker) -> dict:
    """The memory the plan assumed for worker ``w`` and the engines' fractions that give it (module
    docstring): ``max_model_len``, ``kv_gib_per_gpu``, ``weights_gib_per_gpu``, ``reserve_gib_per_gpu``,
    ``memory_gib_per_gpu``, ``vllm`` (gpu-memory-utilization), ``sglang`` (mem-fraction-static) and
    ``source`` (``derived`` or ``measured``: the fraction the measured KV capacity used)."""
    pool = p.pools[w.pool]
    pm, lay = pool.perf, w.layout
    mem = pm.hw.gpu.memory_bytes
    weights = pm.weight_bytes_per_gpu(lay)
    longest = p.traffic.max_len
    dp = lay.attention_dp
    one = pm.kv_bytes_per_gpu(lay, longest, 0)
    if w.role == "prefill":
        kv = one * max(1, math.ceil(w.max_batch / dp))
    else:
        mean = pm.kv_bytes_per_gpu(lay, int(math.ceil(p.traffic.mean_isl)), int(math.ceil(p.traffic.mean_osl)))
        kv = max(one, mean * max(1, math.ceil(w.max_batch / dp)))
    out = {"max_model_len": int(longest), "memory_gib_per_gpu": mem / 2 ** 30, "weights_gib_per_gpu": weights / 2 ** 30,
           "reserve_gib_per_gpu": pm.reserve_bytes / 2 ** 30, "kv_gib_per_gpu": kv / 2 ** 30,
           **memory_fractions(mem, weights + kv, pm.reserve_bytes), "source": "derived"}
    measured = _measured_fraction(pool.steps, lay)
    if measured is not None and p.performance is not None and p.performance.engine in ("vllm", "sglang"):
        out[p.performance.engine] = measured
        out["source"] = f"measured ({p.performance.engine})"
    return out


def _measured_fraction(steps, lay) -> Optional[float]:
    """The of-total memory fraction a measured source sized the layout's KV with (None: analytic)."""
    steps = getattr(steps, "base", steps)  # a calibrated source wraps its base
    of = getattr(steps, "memory_fraction_of", None)
    if of is None:
        return None
    try:
        kind, value = of(lay)
    except Exception:  # noqa: BLE001 - a layout the database cannot time is timed analytically
        return None
    return float(value) if kind == "of_total" else None


@dataclass
class Ctx:
    """What a command step reads: the problem, the worker, its endpoint and the version's flags."""

    p: Problem
    w: Worker
    end: Endpoint
    version: str
    have: frozenset[str]
    mem: dict


Step = Callable[[Ctx, Launch], None]


# ------------------------------------------------------------------ vLLM steps
def _nodes(c: Ctx) -> Nodes:
    return Nodes(c.end.nodes, c.end.node_rank, c.end.head_host, c.end.dist_port)


def _parallel(engine: str) -> Step:
    def step(c: Ctx, x: Launch) -> None:  # the layout's flags (optimizer.launch.parallel_args)
        args, env = parallel_args(engine, c.w.layout, c.p.model.moe is not None, c.have, _nodes(c))
        x.args += args
        x.env.update(env)
    step.__name__ = f"_{engine}_parallel"
    return step


_vllm_parallel = _parallel("vllm")


def _vllm_batch(c: Ctx, x: Launch) -> None:
    if c.w.role != "prefill":  # per DP rank (each DP engine core schedules its own)
        x.args += ["--max-num-seqs", str(max(1, math.ceil(c.w.max_batch / c.w.layout.attention_dp)))]
    if c.w.role == "aggregated":
        x.args += ["--max-num-batched-tokens", str(c.p.chunk_tokens)]


def _vllm_memory(c: Ctx, x: Launch) -> None:
    x.args += ["--max-model-len", str(c.mem["max_model_len"]), "--gpu-memory-utilization", f"{c.mem['vllm']:.2f}"]


def _quant(p) -> Optional[str]:
    """The checkpoint's quantization format (None: unquantized), for :func:`dtype_args`."""
    return p.dtypes.quant_method if getattr(p, "dtypes", None) is not None else None


def _vllm_dtype(c: Ctx, x: Launch) -> None:  # online FP8 quantization of a BF16 checkpoint (or an FP8 one as it is)
    x.args += dtype_args("vllm", c.p.weight_dtype, c.p.kv_dtype, _quant(c.p))


def _vllm_cache(c: Ctx, x: Launch) -> None:
    if c.p.prefix is not None:  # the plan counts on prefix hits: say so (on by default in the V1 engine)
        x.args += ["--enable-prefix-caching"]


def _speculative(c: Ctx, x: Launch, engine: str) -> None:
    if c.p.speculative is not None and c.w.role != "prefill":  # decode and aggregated workers draft
        from optimizer.model.speculative import launch_flags

        x.args += launch_flags(c.p.speculative, engine)


def _vllm_speculative(c: Ctx, x: Launch) -> None:
    _speculative(c, x, "vllm")


def _sglang_speculative(c: Ctx, x: Launch) -> None:
    _speculative(c, x, "sglang")


def _vllm_pd(c: Ctx, x: Launch) -> None:
    if c.w.role in ("prefill", "decode"):
        x.args += ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
        x.env.update({"VLLM_NIXL_SIDE_CHANNEL_HOST": c.end.host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(c.end.side_port),
                      "UCX_NET_DEVICES": "${" + NIC_VARIABLE + "}"})


def _vllm_port(c: Ctx, x: Launch) -> None:
    x.args += ["--port", str(c.end.port if c.end.port is not None else DEFAULT_PORT["vllm"])]


def _two_batches(c: Ctx) -> bool:
    """The worker runs decode steps and the plan times them as two micro-batches."""
    return c.w.role != "prefill" and c.p.pools[c.w.pool].perf.micro_batches == 2


def _overlap(engine: str) -> Step:
    def step(c: Ctx, x: Launch) -> None:  # two-batch overlap (optimizer.launch.overlap_args)
        if _two_batches(c):
            x.args += overlap_args(engine, c.w.layout, c.p.model.moe is not None, c.have, c.version)[0]
    step.__name__ = f"_{engine}_overlap"
    return step


def _sp(engine: str) -> Step:
    def step(c: Ctx, x: Launch) -> None:  # sequence parallelism (optimizer.launch.sp_args)
        x.args += sp_args(engine, c.w.layout, c.p.model.name, c.have, c.version, c.p.speculative is not None)[0]
    step.__name__ = f"_{engine}_sp"
    return step


_vllm_overlap, _sglang_overlap, _vllm_sp, _sglang_sp = _overlap("vllm"), _overlap("sglang"), _sp("vllm"), _sp("sglang")


# ------------------------------------------------------------------ SGLang steps
_sglang_parallel = _parallel("sglang")


def _sglang_batch(c: Ctx, x: Launch) -> None:
    lay = c.w.layout
    if c.w.role != "prefill":  # the worker's total: SGLang divides it over the attention-DP ranks
        x.args += ["--max-running-requests", str(max(1, c.w.max_batch))]
    # a CP worker prefills the whole prompt in one pass, as prefill_terms times it (-1: no chunking);
    # SGLang divides the chunk by the attention-DP size: x DP gives the plan's per-rank chunk
    x.args += ["--chunked-prefill-size", "-1" if lay.cp > 1 else str(c.p.chunk_tokens * lay.attention_dp)]


def _sglang_memory(c: Ctx, x: Launch) -> None:
    x.args += ["--context-length", str(c.mem["max_model_len"]), "--mem-fraction-static", f"{c.mem['sglang']:.2f}"]


def _sglang_dtype(c: Ctx, x: Launch) -> None:
    x.args += dtype_args("sglang", c.p.weight_dtype, c.p.kv_dtype, _quant(c.p))


def _sglang_pd(c: Ctx, x: Launch) -> None:
    if c.w.role in ("prefill", "decode"):
        x.args += ["--disaggregation-mode", c.w.role, "--disaggregation-transfer-backend", "nixl",
                   "--disaggregation-ib-device", "${" + NIC_VARIABLE + "}"]
        x.env["UCX_NET_DEVICES"] = "${" + NIC_VARIABLE + "}"  # NIXL's UCX transport
        if c.w.role == "prefill":
            x.args += ["--disaggregation-bootstrap-port", str(c.end.bootstrap_port)]


def _sglang_port(c: Ctx, x: Launch) -> None:
    x.args += ["--host", "0.0.0.0", "--port", str(c.end.port if c.end.port is not None else DEFAULT_PORT["sglang"])]


STEPS: dict[str, list[Step]] = {
    "vllm": [_vllm_parallel, _vllm_sp, _vllm_overlap, _vllm_batch, _vllm_memory, _vllm_dtype, _vllm_cache,
             _vllm_speculative, _vllm_pd, _vllm_port],
    "sglang": [_sglang_parallel, _sglang_sp, _sglang_overlap, _sglang_batch, _sglang_memory, _sglang_dtype,
               _sglang_speculative, _sglang_pd, _sglang_port],
}
HEAD = {e: (lambda p, e=e: _HEAD[e](p.hf_id)) for e in _HEAD}


def add_step(engine: str, step: Step, before: str = "port") -> None:
    """Add a command step (e.g. speculative decoding's flags) before the engine's step named
    ``_<engine>_<before>`` (the port step by default, which stays last)."""
    steps = STEPS[engine]
    i = next((k for k, s in enumerate(steps) if s.__name__ == f"_{engine}_{before}"), len(steps))
    steps.insert(i, step)


def launch(p: Problem, w: Worker, engine: str, end: Optional[Endpoint] = None) -> Launch:
    """The worker's command for ``engine`` at its version, every flag checked (:meth:`Launch.check`)."""
    version = engine_version(p, engine)
    c = Ctx(p, w, end or Endpoint(), version, flag_list(engine, version), memory_plan(p, w))
    x = Launch(engine, version, HEAD[engine](p))
    for step in STEPS[engine]:
        step(c, x)
    return x.check()


def vllm(p: Problem, w: Worker, port: int = 8000) -> str:
    return launch(p, w, "vllm", Endpoint(port=port)).command()


def sglang(p: Problem, w: Worker, port: int = 30000) -> str:
    return launch(p, w, "sglang", Endpoint(port=port)).command()


def engines_for(p: Problem, w: Worker) -> list[str]:
    """The engines asked (``serving.engine``) that can run the worker (no vLLM for a CP worker)."""
    moe = p.model.moe is not None
    return [e for e in ("vllm", "sglang") if p.engine in (e, "both") and layout_note(e, w.layout, moe, w.role) is None]


def launch_notes(p: Problem, w: Worker) -> list[str]:
    """What the plan says instead of a command an engine cannot run (a CP worker under vLLM 0.24.0),
    and what a command cannot set: two-batch overlap or sequence parallelism an engine (version)
    does not run for the worker's layout (:func:`optimizer.launch.overlap_args`, :func:`optimizer.launch.sp_args`)."""
    moe = p.model.moe is not None
    out = [n for e in ("vllm", "sglang") if p.engine in (e, "both")
           for n in [layout_note(e, w.layout, moe, w.role)] if n is not None]
    for e in engines_for(p, w):  # engines that run the worker without the plan's overlap or SP flag
        have, version = flag_list(e, engine_version(p, e)), engine_version(p, e)
        notes = [sp_args(e, w.layout, p.model.name, have, version, p.speculative is not None)[1]]
        if p.pools[w.pool].perf.micro_batches == 2 and w.role != "prefill":
            notes.append(overlap_args(e, w.layout, moe, have, version)[1])
        out += [n for n in notes if n is not None]
    if "vllm" in engines_for(p, w):
        m = memory_plan(p, w)
        if m["capped"]:
            out.append(f"vLLM --gpu-memory-utilization {m['vllm']:.2f} (memory less the plan's reserve): the plan fills "
                       f"the GPU, so vLLM's KV pool is short of the plan's {m['kv_gib_per_gpu']:.1f} GiB per GPU by the "
                       f"activations it profiles inside that budget; plan with a larger serving.reserve_gib_per_gpu")
    sp = p.speculative
    if sp is not None and sp.method != "mtp" and not sp.draft_hf_id and w.role != "prefill":
        from optimizer.model.speculative import DRAFT_MODEL_PLACEHOLDER

        out.append(f"speculative {sp.method}: no serving.speculative.draft_hf_id, so the commands carry the placeholder "
                   f"{DRAFT_MODEL_PLACEHOLDER}: replace it with the draft model's name or path")
    return out


def commands(p: Problem, w: Worker) -> dict[str, str]:
    """``{engine: command}`` for the engines asked (``serving.engine``) that can run the worker
    (no vLLM command for a context-parallel worker, :func:`launch_notes`)."""
    return {e: launch(p, w, e).command() for e in engines_for(p, w)}
