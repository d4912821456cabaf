"""Engine-independent parts of the launch commands: flag lists, the checked command, the layout's
parallel flags per engine, the memory fractions, placement on servers (devices, ports, scripts).

Shared by the serving problem (:mod:`optimizer.serving.launch`, :mod:`optimizer.serving.deploy`)
and the deployment problem (:mod:`optimizer.deployment.launch`); each builds its own commands
from these pieces.

Flag lists: ``instances/engines/<engine>-<version>.yaml``, every flag the release's argument
parser registers (read from the released wheel by ``instances/engines/extract_flags.py``). A
command printing a flag its version does not have is a programming error (:class:`UnknownFlag`).
The version is the instance's ``performance.engine_version`` when it names one, else
:data:`DEFAULT_VERSION` (the measured database's current versions).

Layout -> flags (:func:`parallel_args`; the layout notation is docs/model.md "Layout notation"):

* vLLM: ``--tensor-parallel-size`` attention TP, ``--pipeline-parallel-size`` PP,
  ``--data-parallel-size`` attention DP (one engine core per DP rank, each of TP x PP GPUs),
  ``--enable-expert-parallel`` for EP. vLLM's experts form one group over the TP x DP GPUs: a TP
  group by default, an EP group with the flag (vLLM ``docs/serving/data_parallel_deployment.md``:
  "expert layers form a tensor parallel group of size DP x TP. To use expert parallelism instead,
  include --enable-expert-parallel"), so a layout whose experts are split both ways (``EP4xTP2``)
  has no vLLM command (:func:`layout_note`). Several servers (vLLM
  ``docs/serving/parallelism_scaling.md``, multiprocessing backend): every server runs the same
  command with ``--nnodes N --node-rank R --master-addr HEAD --master-port P`` and ``--headless``
  on ranks > 0; with attention DP over servers instead (each DP rank within one server,
  ``data_parallel_deployment.md``): ``--data-parallel-size-local`` (the ranks of this server),
  ``--data-parallel-address HEAD --data-parallel-rpc-port P`` and, on the other servers,
  ``--headless --data-parallel-start-rank``.
* SGLang: ``--tp-size`` the GPUs of a pipeline stage (attention TP x DP x CP: SGLang's attention TP
  is tp / dp), ``--pp-size`` PP, attention DP ``--dp-size N --enable-dp-attention`` up to 0.5.16 and
  ``--attn-dp-size N`` from 0.5.23 (the flag list decides), ``--ep-size`` EP (SGLang's experts TP is
  tp / ep, so ``EP4xTP2`` is ``--tp-size 8 --ep-size 4``), prefill CP ``--attn-cp-size C
  --enable-prefill-cp --cp-strategy zigzag`` with ``SGLANG_ENABLE_CP_V2=1``; several servers:
  ``--nnodes N --node-rank R --dist-init-addr HEAD:PORT``.
* Context parallelism at decode: both engines' decode CP (vLLM ``--decode-context-parallel-size``,
  SGLang ``--dcp-size``) stripes the KV over the GPUs of the TP group itself; a layout whose CP
  ranks are separate TP x DP groups holding the same weights (``TP2xCP4``) is not what either runs,
  so it gets a note instead of a command. vLLM 0.24.0 has no prefill CP either (no attention
  backend declares ``supports_pcp``, :data:`VLLM_CP`).

Two-batch overlap and sequence parallelism (:func:`overlap_args`, :func:`sp_args`): SGLang
``--enable-two-batch-overlap --moe-a2a-backend deepep`` / vLLM ``--enable-dbo --all2all-backend
deepep_low_latency --dbo-decode-token-threshold 2`` on decode-running workers of a plan with
``micro_batches: 2`` whose layout the engine overlaps (EP All-to-All); SP layouts vLLM
``--compilation-config '{"pass_config":{"enable_sp":true}}'``, SGLang ``--enable-layernorm-sp``
(0.5.23, Qwen3 dense). Where an engine or its version cannot, a note says so instead.

Memory (:func:`memory_fractions`): vLLM ``--gpu-memory-utilization U = ceil_0.01((weights + reserve +
kv) / memory)``: its budget holds the weights, the profiled activations (the plan's reserve) and the
KV (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``), at most ``floor_0.01((memory -
reserve) / memory)`` (vLLM needs ``U x memory`` free at start-up); SGLang ``--mem-fraction-static
f = ceil_0.01((weights + kv) / memory)``: its static pool is the weights and the KV
(``server_args.py`` help).
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

import yaml

from optimizer.errors import InputError
from optimizer.model.layout import Layout

ENGINES_DIR = Path(__file__).resolve().parents[1] / "instances" / "engines"
ENGINES = ("vllm", "sglang")
MODEL_PLACEHOLDER = "MODEL"  # the model of a command when the instance names no model.hf_id
DEFAULT_VERSION = {"vllm": "0.24.0", "sglang": "0.5.14"}  # the measured database's current versions
DEFAULT_PORT = {"vllm": 8000, "sglang": 30000}  # the engines' default HTTP ports
DIST_PORT = 29500  # SGLang --dist-init-addr port (no default in SGLang: the torch.distributed convention)
VLLM_MASTER_PORT = 29501  # vLLM --master-port default (ParallelConfig.master_port)
VLLM_DP_RPC_PORT = 29550  # vLLM --data-parallel-rpc-port default
HEAD = {"vllm": lambda model: ["vllm", "serve", model],
        "sglang": lambda model: ["python", "-m", "sglang.launch_server", "--model-path", model]}

VLLM_CP = ("vLLM 0.24.0 has --prefill-context-parallel-size but no attention backend in that release supports "
           "it (supports_pcp is False on every implementation; vllm/v1/worker/cp_utils.py asserts it at start-up): "
           "no vLLM command for the CP prefill workers; use the SGLang one")
CP_DECODE = ("{engine}: no command for {label}: its CP ranks are separate TP x DP groups holding the same weights, while "
             "the engine's decode context parallelism ({flag}) stripes the KV over the GPUs of one TP group")
HYBRID_EXPERTS = ("vllm: no command for {label}: vLLM's experts form one group over the TP x DP GPUs, all TP (default) "
                  "or all EP (--enable-expert-parallel); experts split EP{ep} x TP{tp} need SGLang (--ep-size)")


class UnknownFlag(RuntimeError):
    """A command builder emitted a flag the named engine version does not have."""


@lru_cache(maxsize=None)
def flag_list(engine: str, version: str) -> frozenset[str]:
    """The flags ``engine`` ``version``'s argument parser registers (``instances/engines``).

    Raises:
        InputError: no flag list for that version (the message names the versions there are).
    """
    f = ENGINES_DIR / f"{engine}-{version}.yaml"
    if not f.is_file():
        have = sorted(x.stem.split("-", 1)[1] for x in ENGINES_DIR.glob(f"{engine}-*.yaml"))
        raise InputError(f, "performance.engine_version", f"no flag list for {engine} {version} (instances/engines "
                                                          f"has {', '.join(have)}): launch commands need one")
    return frozenset(yaml.safe_load(f.read_text())["flags"])


def check_engine_version(perf) -> None:
    """``performance.engine_version`` (a :class:`optimizer.model.steptimes.Performance`) must have a
    flag list (the plan's launch commands are checked against it).

    Raises:
        InputError: naming the instance file, ``performance.engine_version`` and the versions there are."""
    if perf.engine_version is None:
        return
    try:
        flag_list(perf.engine, perf.engine_version)
    except InputError as exc:
        raise InputError(perf.path, f"{perf.where}.engine_version", exc.problem) from None


def quote(s: str) -> str:
    """Shell quoting that leaves ``${VARIABLE}`` references expandable (double quotes)."""
    return f'"{s}"' if s.startswith("${") else shlex.quote(s)


@dataclass
class Launch:
    """One command: ``env`` then ``args`` (shell variables ``${...}`` stay unquoted)."""

    engine: str
    version: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def flags(self) -> list[str]:
        return [a.split("=", 1)[0] for a in self.args if a.startswith("--")]

    def check(self) -> "Launch":
        """Raise :class:`UnknownFlag` for a flag the engine version does not have."""
        have = flag_list(self.engine, self.version)
        bad = [f for f in self.flags() if f not in have]
        if bad:
            raise UnknownFlag(f"{self.engine} {self.version} has no {', '.join(bad)} "
                              f"(instances/engines/{self.engine}-{self.version}.yaml)")
        return self

    def command(self) -> str:
        env = " ".join(f"{k}={quote(v)}" for k, v in self.env.items())
        return ("env " + env + " " if env else "") + " ".join(quote(a) for a in self.args)


# ------------------------------------------------------------------ layout -> flags
@dataclass(frozen=True)
class Nodes:
    """The servers one engine instance spans: ``count`` of them, this command's ``rank``, the
    first server's address ``head`` (a shell variable such as ``${SERVER_0_HOST}``) and the
    rendezvous ``port`` (SGLang ``--dist-init-addr``, vLLM ``--master-port`` or, with DP over
    servers, ``--data-parallel-rpc-port``)."""

    count: int = 1
    rank: int = 0
    head: str = "${SERVER_HOST}"
    port: Optional[int] = None


def layout_note(engine: str, lay: Layout, moe: bool, role: str = "decode", gpus_per_node: Optional[int] = None,
                nodes: int = 1) -> Optional[str]:
    """Why ``engine`` cannot run ``lay`` as laid out (None: it can). ``role`` ``prefill`` allows
    SGLang's prefill CP; ``gpus_per_node`` the GPUs of each of the ``nodes`` servers."""
    if lay.cp > 1:
        if engine == "vllm":
            return VLLM_CP if role == "prefill" else CP_DECODE.format(
                engine=engine, label=lay.label(), flag="--decode-context-parallel-size")
        if role != "prefill":
            return CP_DECODE.format(engine=engine, label=lay.label(), flag="--dcp-size")
    if engine == "vllm" and moe and lay.experts_ep > 1 and lay.experts_tp > 1:
        return HYBRID_EXPERTS.format(label=lay.label(), ep=lay.experts_ep, tp=lay.experts_tp)
    if engine == "vllm" and nodes > 1 and lay.attention_dp > 1:
        rank_gpus = lay.attention_tp * lay.pp
        if gpus_per_node is None or gpus_per_node % rank_gpus or (lay.attention_dp * rank_gpus) % gpus_per_node:
            return (f"vllm: no command for {lay.label()} over {nodes} servers: vLLM places whole DP ranks "
                    f"(TP x PP = {rank_gpus} GPUs) on each server, which {gpus_per_node} GPUs per server do not hold")
    return None


def parallel_args(engine: str, lay: Layout, moe: bool, have: frozenset[str], nodes: Nodes = Nodes(),
                  gpus_per_node: Optional[int] = None) -> tuple[list[str], dict[str, str]]:
    """The layout's flags (and environment) for ``engine`` (module docstring); ``have`` the
    version's flag list (SGLang's attention-DP flag by version). Call :func:`layout_note` first."""
    args: list[str] = []
    env: dict[str, str] = {}
    if engine == "vllm":
        args += ["--tensor-parallel-size", str(lay.attention_tp)]
        if lay.pp > 1:
            args += ["--pipeline-parallel-size", str(lay.pp)]
        if lay.attention_dp > 1:
            args += ["--data-parallel-size", str(lay.attention_dp)]
        if moe and lay.experts_ep > 1:
            args += ["--enable-expert-parallel"]
        if nodes.count > 1 and lay.attention_dp > 1:  # whole DP ranks per server
            local = lay.attention_dp // nodes.count
            args += ["--data-parallel-size-local", str(local), "--data-parallel-address", nodes.head,
                     "--data-parallel-rpc-port", str(nodes.port or VLLM_DP_RPC_PORT)]
            if nodes.rank > 0:
                args += ["--headless", "--data-parallel-start-rank", str(nodes.rank * local)]
        elif nodes.count > 1:
            args += ["--nnodes", str(nodes.count), "--node-rank", str(nodes.rank), "--master-addr", nodes.head,
                     "--master-port", str(nodes.port or VLLM_MASTER_PORT)]
            if nodes.rank > 0:
                args += ["--headless"]
        return args, env
    args += ["--tp-size", str(lay.gpus_per_stage)]
    if lay.pp > 1:
        args += ["--pp-size", str(lay.pp)]
    if lay.cp > 1:  # SGLang 0.5.14 server_args: --attn-cp-size, --enable-prefill-cp, --cp-strategy {zigzag,interleave}
        env["SGLANG_ENABLE_CP_V2"] = "1"
        args += ["--attn-cp-size", str(lay.cp), "--enable-prefill-cp", "--cp-strategy", "zigzag"]
    if lay.attention_dp > 1:
        args += (["--attn-dp-size", str(lay.attention_dp)] if "--attn-dp-size" in have
                 else ["--dp-size", str(lay.attention_dp), "--enable-dp-attention"])
    if moe and lay.experts_ep > 1:
        args += ["--ep-size", str(lay.experts_ep)]
    if nodes.count > 1:
        args += ["--nnodes", str(nodes.count), "--node-rank", str(nodes.rank),
                 "--dist-init-addr", f"{nodes.head}:{nodes.port or DIST_PORT}"]
    return args, env


TBO_FLAG = {"sglang": "--enable-two-batch-overlap", "vllm": "--enable-dbo"}
VLLM_SP_CONFIG = '{"pass_config":{"enable_sp":true}}'  # vllm/config/compilation.py PassConfig.enable_sp
SGLANG_SP_FLAG = "--enable-layernorm-sp"
SGLANG_SP_MODELS = ("qwen3",)  # model_type of SGLang's SP_SUPPORTED_ARCHITECTURES (Qwen3ForCausalLM)


def overlap_args(engine: str, lay: Layout, moe: bool, have: frozenset[str], version: str) -> tuple[list[str], Optional[str]]:
    """Flags that make ``engine`` run each decode step as two overlapped micro-batches (the plan's
    ``micro_batches: 2``), or a note saying why it cannot (then it runs one batch per step, which
    the plan did not time). Both engines overlap around an expert-parallel All-to-All only:

    * SGLang ``--enable-two-batch-overlap --moe-a2a-backend deepep``: ``server_args.py`` refuses
      two-batch overlap with ``moe_a2a_backend`` ``none`` ("When enabling two batch overlap,
      moe_a2a_backend cannot be 'none'"); DeepEP spreads the experts over every GPU of the
      worker (``--ep-size`` = ``--tp-size``), so the layout's experts must be EP over all of them
      (``experts.tp = 1``).
    * vLLM ``--enable-dbo --all2all-backend deepep_low_latency --dbo-decode-token-threshold 2``:
      vLLM's ``docs/design/dbo.md`` ("This system currently only targets DP+EP deployments",
      DeepEP only, ``deepep_low_latency`` for decode); a decode-only batch is micro-batched when
      it has at least the threshold's tokens (``ubatch_utils.check_ubatch_thresholds``, default
      32), so 2 matches the plan's rule (two sequences per DP rank split).

    Every flag is also checked against the version's flag list: a version without it gets the note."""
    label = lay.label()
    flag = TBO_FLAG[engine]
    if flag not in have:
        return [], f"{engine} {version} has no {flag}: its workers run one batch per decode step, not the plan's two"
    if engine == "sglang":
        if not (moe and lay.experts_ep > 1 and lay.experts_tp == 1 and lay.experts_ep == lay.gpus_per_stage):
            return [], (f"sglang: no two-batch overlap for {label}: SGLang overlaps two micro-batches around an "
                        "expert-parallel All-to-All only (--moe-a2a-backend deepep, the experts EP over every GPU of "
                        "the worker); this worker runs one batch per decode step, not the plan's two")
        return [flag, "--moe-a2a-backend", "deepep"], None
    if not (moe and lay.attention_dp > 1 and lay.experts_ep > 1):
        return [], (f"vllm: no dual-batch overlap for {label}: vLLM's DBO targets DP attention + expert parallelism "
                    "(DeepEP All-to-All) only; this worker runs one batch per decode step, not the plan's two")
    return [flag, "--all2all-backend", "deepep_low_latency", "--dbo-decode-token-threshold", "2"], None


def sp_args(engine: str, lay: Layout, model_type: str, have: frozenset[str], version: str,
            speculative: bool = False) -> tuple[list[str], Optional[str]]:
    """Flags that turn on sequence parallelism for an SP layout (``TP8 SP``), or a note why not
    (the engine then runs plain TP, which the plan times equally: SP changes activation memory,
    not the ring time).

    * vLLM ``--compilation-config '{"pass_config":{"enable_sp":true}}'`` (``PassConfig.enable_sp``,
      "Enable sequence parallelism", a torch.compile pass rewriting each AllReduce as
      ReduceScatter + AllGather).
    * SGLang ``--enable-layernorm-sp`` (from 0.5.23; its help: "Megatron-style sequence parallelism
      ... Prefill only; Qwen3 dense; requires tp_size > 1"; DP attention and speculative decoding
      are refused with it, other architectures rejected at start-up)."""
    if not lay.sp:
        return [], None
    if engine == "vllm":
        if "--compilation-config" not in have:
            return [], f"vllm {version} has no --compilation-config: {lay.label()} runs without sequence parallelism"
        return ["--compilation-config", VLLM_SP_CONFIG], None
    if SGLANG_SP_FLAG not in have:
        return [], (f"sglang {version} has no sequence-parallel flag ({SGLANG_SP_FLAG} arrives in 0.5.23): "
                    f"{lay.label()} runs as plain TP (timed alike: SP changes activation memory, not ring time)")
    if model_type not in SGLANG_SP_MODELS or lay.attention_dp > 1 or speculative:
        return [], (f"sglang: {SGLANG_SP_FLAG} runs Qwen3 dense models without DP attention or speculative "
                    f"decoding only: {lay.label()} runs as plain TP (timed alike)")
    return [SGLANG_SP_FLAG], None


def dtype_args(engine: str, weight_dtype: Optional[str], kv_dtype: Optional[str],
               checkpoint_quant: Optional[str] = None) -> list[str]:
    """FP8 weights (``--quantization fp8``: vLLM quantizes a BF16 checkpoint online, its FP8 docs)
    and an FP8 KV cache (vLLM ``fp8``, SGLang ``fp8_e4m3``). A checkpoint quantized in another
    format (``checkpoint_quant``, its quant_method: modelopt, compressed-tensors, ...) gets no
    ``--quantization``: the engines read it from the checkpoint and refuse a different method
    (vLLM ``ModelConfig._verify_quantization``)."""
    out = []
    if weight_dtype == "fp8" and checkpoint_quant in (None, "fp8"):
        out += ["--quantization", "fp8"]
    if kv_dtype == "fp8":
        out += ["--kv-cache-dtype", "fp8" if engine == "vllm" else "fp8_e4m3"]
    return out


# ------------------------------------------------------------------ memory
def ceil_fraction(x: float) -> float:
    """``x`` rounded up to the next 0.01, at most 1."""
    return min(1.0, math.ceil(round(x * 100, 6)) / 100)


def memory_fractions(memory: float, pool: float, reserve: float) -> dict:
    """The engines' memory fractions for a GPU of ``memory`` bytes holding ``pool`` bytes of weights
    and KV plus ``reserve`` bytes of activations (module docstring): ``vllm``, ``sglang`` and
    ``capped`` (vLLM's fraction hit its start-up limit)."""
    out = {"vllm": ceil_fraction((pool + reserve) / memory), "sglang": ceil_fraction(pool / memory), "capped": False}
    top = math.floor((memory - reserve) / memory * 100) / 100  # vLLM needs U x memory free at start-up
    if out["vllm"] > top:
        out["vllm"], out["capped"] = top, True
    return out


# ------------------------------------------------------------------ placement
def host(server: int) -> str:
    """The address of server ``server``: a shell variable the user sets."""
    return "${SERVER_%d_HOST}" % server


class Ports:
    """Ports per server: each engine instance takes the next free one on every server it spans,
    from the engine's default (HTTP) or a rendezvous base."""

    def __init__(self, base: int):
        self.base = base
        self.next: dict[int, int] = {}

    def take(self, servers) -> int:
        port = max(self.next.get(s, self.base) for s in servers)
        for s in servers:
            self.next[s] = port + 1
        return port


def script(cmd: str, comment: str, devices, servers: int, extra_variables: str = "") -> str:
    """A ``/bin/sh`` script running ``cmd`` on the GPUs ``devices`` (``CUDA_VISIBLE_DEVICES``)."""
    dev = ",".join(map(str, devices))
    return (f"#!/bin/sh\n# {comment}\n# Set SERVER_0_HOST..SERVER_{servers - 1}_HOST (the servers' addresses)"
            + extra_variables + f".\nset -eu\nexport CUDA_VISIBLE_DEVICES={dev}\nexec {cmd}\n")
