"""Launch commands of a deployment plan: per replica (plan instance) a vLLM and an SGLang command
with its layout as engine flags, placed on the GPUs and servers the plan gives it.

The engine-independent parts are :mod:`optimizer.launch` (flag lists and checks, the layout's
flags, the memory fractions, ports and scripts; the serving problem uses the same). A deployment
instance has no ``performance`` section, so every command is for the engine's default version
(:data:`optimizer.launch.DEFAULT_VERSION`), every flag checked against that version's flag list.

Per replica, from the plan:

* the layout (``Layout.label()``, docs/model.md "Layout notation") as flags
  (:func:`optimizer.launch.parallel_args`); a layout an engine cannot run gets a note instead
  (:func:`optimizer.launch.layout_note`: CP ranks as separate groups, vLLM with experts split
  EP x TP, vLLM DP ranks that do not tile the servers);
* ``--max-model-len`` / ``--context-length``: the longest session of the replica (context + new tokens);
* ``--max-num-seqs`` (vLLM, per DP rank: each DP engine core schedules its own, ``ceil(batch / dp)``)
  / ``--max-running-requests`` (SGLang, the replica's total, divided over its attention-DP ranks by
  SGLang): the replica's batch (``max_batch``);
* the memory fraction that holds what the plan assumed per GPU: the evaluator's memory of the
  fullest GPU (weights + the KV of every session of the replica + the reserve, eq. 6-1), vLLM
  ``--gpu-memory-utilization`` (all of it) and SGLang ``--mem-fraction-static`` (less the reserve),
  :func:`optimizer.launch.memory_fractions`;
* ``CUDA_VISIBLE_DEVICES``: the replica's GPUs on each server (global id ``server x GPUs per
  server + local``), one command per server it spans (vLLM ``--nnodes``/``--node-rank``/
  ``--master-addr``/``--headless``, or ``--data-parallel-*`` with DP over servers; SGLang
  ``--nnodes``/``--node-rank``/``--dist-init-addr``); each replica its own HTTP port on its servers
  (the engine's default + 0, 1, ...) and rendezvous port;
* sequence parallelism for an SP layout (``TP8 SP``) and, with ``deployment.micro_batches: 2``,
  two-batch overlap, where the engine version has the flag and runs it for the layout
  (:func:`optimizer.launch.sp_args`, :func:`optimizer.launch.overlap_args`), else a note;
* ``model.rope_scaling`` passed on (vLLM ``--hf-overrides``, SGLang ``--json-model-override-args``,
  both a JSON update of the HF config) so the engine accepts the extended context; FP8 weights
  / KV as :func:`optimizer.launch.dtype_args`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from optimizer.launch import (DEFAULT_PORT, DEFAULT_VERSION, DIST_PORT, ENGINES, HEAD, MODEL_PLACEHOLDER,
                              VLLM_DP_RPC_PORT, VLLM_MASTER_PORT, Launch, Nodes, Ports, dtype_args, flag_list, host,
                              layout_note, memory_fractions, overlap_args, parallel_args, script, sp_args)

DTYPE_FLAG = MappingProxyType({"fp16": "float16", "fp32": "float32"})  # --dtype of both engines; bf16 is the checkpoints' own


@dataclass
class NodeCommand:
    """One server's part of a replica: its GPUs there and each engine's checked command."""

    server: int
    node_rank: int
    devices: list[int]
    launches: dict[str, Launch] = field(default_factory=dict)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.devices))

    def command(self, engine: str) -> str:
        return f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices} {self.launches[engine].command()}"


@dataclass
class ReplicaLaunch:
    """The commands of one plan instance: per server (:class:`NodeCommand`), ports and notes."""

    instance: str
    layout: str
    servers: list[int]
    nodes: list[NodeCommand]
    ports: dict[str, int]
    max_model_len: int
    memory: dict
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        """``launch`` ``{engine: command}`` (the first server's), ``launch_nodes`` (every server's)
        and ``launch_notes`` (engines without a command and why)."""
        engines = [e for e in ENGINES if e in self.nodes[0].launches]
        d: dict[str, Any] = {"launch": {e: self.nodes[0].command(e) for e in engines}}
        d["launch_nodes"] = [{"server": n.server, "node_rank": n.node_rank, "cuda_visible_devices": n.cuda_visible_devices,
                              "commands": {e: n.command(e) for e in engines}} for n in self.nodes]
        d["launch_memory"] = {"max_model_len": self.max_model_len, **self.memory, "ports": self.ports}
        if self.notes:
            d["launch_notes"] = list(self.notes)
        return d


def _model_args(engine: str, p) -> list[str]:
    """Dtype and RoPE flags (:func:`dtype_notes`: what they cannot set)."""
    args = dtype_args(engine, p.weight_dtype, p.kv_dtype, p.dtypes.quant_method if p.dtypes is not None else None)
    if p.weight_dtype in DTYPE_FLAG:
        args += ["--dtype", DTYPE_FLAG[p.weight_dtype]]
    if p.rope_scaling is not None:
        args += ["--hf-overrides" if engine == "vllm" else "--json-model-override-args",
                 json.dumps({"rope_scaling": p.rope_scaling}, separators=(",", ":"))]
    return args


def dtype_notes(p) -> list[str]:
    """What the commands cannot set: weights in an integer / FP4 format need a checkpoint in it (the
    engines read its quantization from the checkpoint); a KV dtype other than the model's or FP8."""
    out = []
    if p.weight_dtype in ("int8", "int4", "fp4"):
        out.append(f"weights {p.weight_dtype}: serve a checkpoint quantized to {p.weight_dtype} as the model "
                   "(the engines read its quantization from it)")
    if p.kv_dtype not in ("fp8", p.weight_dtype, "bf16"):
        out.append(f"kv {p.kv_dtype}: the engines' KV cache follows the model's dtype (or --kv-cache-dtype fp8); "
                   f"the commands do not set {p.kv_dtype}")
    return out


def replica_launches(p, ev, perf) -> list[ReplicaLaunch]:
    """The commands of every instance of the evaluated plan ``ev`` (module docstring)."""
    G = p.server.gpus
    by_id = {s.id: s for s in p.sessions}
    moe = p.model.moe is not None
    http = {e: Ports(DEFAULT_PORT[e]) for e in ENGINES}
    rendezvous = {"sglang": Ports(DIST_PORT), "vllm": Ports(VLLM_MASTER_PORT), "vllm-dp": Ports(VLLM_DP_RPC_PORT)}
    out = []
    for inst in ev.plan.instances:
        lay = inst.lay
        servers = sorted({g // G for g in inst.gpus})
        nodes = [NodeCommand(s, r, sorted(g % G for g in inst.gpus if g // G == s)) for r, s in enumerate(servers)]
        sessions = [by_id[s] for s in inst.sessions if s in by_id]
        longest = max((s.context + s.new for s in sessions), default=1)
        mem = ev.memory_per_gpu[inst.id]
        fr = memory_fractions(p.gpu.memory_bytes, mem - p.reserve_bytes, p.reserve_bytes)
        memory = {"memory_gb_per_gpu": round(mem / 1e9, 4), "gpu_memory_utilization": fr["vllm"],
                  "mem_fraction_static": fr["sglang"]}
        notes, ports = [], {}
        even = len({len(n.devices) for n in nodes}) == 1
        for engine in ENGINES:
            note = layout_note(engine, lay, moe, "decode", G, len(nodes))
            if note is None and not even:
                note = (f"{engine}: no command for {lay.label()}: its GPUs are split unevenly over servers "
                        f"{', '.join(map(str, servers))}")
            if note is not None:
                notes.append(note)
                continue
            version = DEFAULT_VERSION[engine]
            have = flag_list(engine, version)
            port = ports[engine] = http[engine].take(servers)
            key = "vllm-dp" if engine == "vllm" and lay.attention_dp > 1 else engine
            rport = rendezvous[key].take(servers) if len(nodes) > 1 else None
            if rport is not None:
                ports[f"{engine}_rendezvous"] = rport
            extra = _model_args(engine, p)
            feature, feature_notes = [], []
            for args, note in (sp_args(engine, lay, p.model.name, have, version),
                               overlap_args(engine, lay, moe, have, version) if p.micro_batches == 2 else ([], None)):
                feature += args
                if note is not None:
                    feature_notes.append(note)
            notes += feature_notes
            for n in nodes:
                par, env = parallel_args(engine, lay, moe, have, Nodes(len(nodes), n.node_rank, host(servers[0]), rport))
                x = Launch(engine, version, HEAD[engine](p.hf_id) + par + feature, dict(env))
                batch = max(1, inst.max_batch)
                if engine == "vllm":
                    x.args += ["--max-num-seqs", str(math.ceil(batch / lay.attention_dp)),
                               "--max-model-len", str(longest), "--gpu-memory-utilization", f"{fr['vllm']:.2f}",
                               *extra, "--port", str(port)]
                else:
                    x.args += ["--max-running-requests", str(batch), "--context-length", str(longest),
                               "--mem-fraction-static", f"{fr['sglang']:.2f}", *extra,
                               "--host", "0.0.0.0", "--port", str(port)]
                n.launches[engine] = x.check()
            if engine == "vllm" and fr["capped"]:
                notes.append(f"vllm: --gpu-memory-utilization {fr['vllm']:.2f} (memory less the plan's reserve): the "
                             "plan fills the GPU, so vLLM's KV pool is short of the plan's by the activations it "
                             "profiles inside that budget; plan with a larger deployment.reserve_gib_per_gpu")
        out.append(ReplicaLaunch(inst.id, lay.label(), servers, nodes, ports, longest, memory, notes))
    return out


def notes_for(p) -> list[str]:
    """Plan-wide sentences for the launch commands (no model name, dtypes they cannot set)."""
    out = []
    if p.hf_id == MODEL_PLACEHOLDER:
        out.append("no model.hf_id: the launch commands say MODEL; replace it with the model's name or folder")
    return out + dtype_notes(p)


def write(p, replicas: list[ReplicaLaunch], folder: Path) -> list[Path]:
    """``folder/deploy/<engine>/<instance>-<layout>[-node<r>].sh`` (one per replica and server, with
    its ``CUDA_VISIBLE_DEVICES``) and ``folder/deploy/deployment.json`` (every command, its server,
    devices, ports and version; the notes)."""
    root = folder / "deploy"
    files: list[Path] = []
    servers = p.servers
    doc: dict[str, Any] = {"servers": [{"index": s, "host_variable": f"SERVER_{s}_HOST"} for s in range(servers)],
                           "versions": dict(DEFAULT_VERSION), "replicas": [], "notes": notes_for(p)}
    for r in replicas:
        ent: dict[str, Any] = {"instance": r.instance, "layout": r.layout, "servers": r.servers,
                               "max_model_len": r.max_model_len, **r.memory, "ports": r.ports, "notes": r.notes,
                               "nodes": []}
        tag = r.layout.replace("/", "-").replace(" ", "").lower()
        for n in r.nodes:
            row: dict[str, Any] = {"server": n.server, "node_rank": n.node_rank,
                                   "cuda_visible_devices": n.cuda_visible_devices, "scripts": {}, "commands": {}}
            for engine, x in n.launches.items():
                d = root / engine
                d.mkdir(parents=True, exist_ok=True)
                f = d / (f"{r.instance}-{tag}.sh" if len(r.nodes) == 1 else f"{r.instance}-{tag}-node{n.node_rank}.sh")
                where = f"server {n.server}" + (f" (node {n.node_rank} of {len(r.nodes)})" if len(r.nodes) > 1 else "")
                f.write_text(script(x.command(), f"{r.instance}: {r.layout} on {where}, {engine} {x.version}",
                                    n.devices, servers))
                f.chmod(0o755)
                files.append(f)
                row["scripts"][engine] = str(f.relative_to(root))
                row["commands"][engine] = n.command(engine)
            ent["nodes"].append(row)
        doc["replicas"].append(ent)
    root.mkdir(parents=True, exist_ok=True)
    f = root / "deployment.json"
    f.write_text(json.dumps(doc, indent=2))
    files.append(f)
    return files

