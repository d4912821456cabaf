"""A deployment a cluster can run: the best plan's workers placed on servers, one script per
worker, the P/D router, ``deployment.json`` and (``--deploy kubernetes``) manifests.

Placement (:func:`place`): the plan's workers, group by group as the plan lists them, go first-fit
onto the servers of their pool (a worker takes the lowest free GPU indices of the first server
with room for it, ``CUDA_VISIBLE_DEVICES``); a worker wider than a server takes whole servers of
its own (``ceil(GPUs / GPUs per server)``), one script per server it spans (SGLang ``--nnodes``,
``--node-rank``, ``--dist-init-addr``; no vLLM multi-server command is generated, said in the
notes). Servers are numbered across pools in the instance's order; their addresses are shell
variables ``SERVER_0_HOST``, ``SERVER_1_HOST``, ... the user sets. Per server and engine each
worker gets its own HTTP port (the engine's default + 0, 1, ...), vLLM its own NIXL side-channel
base port (5600, then + the DP ranks of the workers before it: vLLM takes base + dp_rank) and SGLang
prefill workers their own bootstrap port (8998, 8999, ...). The router runs on server 0 on the
first port after its workers'.

Routers (disaggregated plans): vLLM's documented P/D proxy,
``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port P --prefiller-hosts ...
--prefiller-ports ... --decoder-hosts ... --decoder-ports ...`` (vLLM
``docs/features/nixl_connector_usage.md``; a test script of the vLLM repository, not a production
router); SGLang's ``python -m sglang_router.launch_router --pd-disaggregation --prefill URL
BOOTSTRAP_PORT ... --decode URL ... --host 0.0.0.0 --port P`` (package ``sglang-router``).
Aggregated plans get no router (any HTTP load balancer over the worker URLs).

Kubernetes (:func:`manifests`): per worker group a ``StatefulSet`` (stable per-pod names
``<group>-<i>.<group>``, which the P/D router must address pod by pod: an SGLang decode must reach
the very prefill pod whose bootstrap room it was given) with a headless ``Service``, containers
asking ``nvidia.com/gpu`` = the worker's GPUs; a ``Deployment`` + ``Service`` for the router.
The NIXL side-channel host is the pod's IP (downward API ``status.podIP``). Images are the
engines' public ones at the version named (``vllm/vllm-openai:v<version>``,
``lmsysorg/sglang:v<version>``); workers wider than one server are not generated for Kubernetes
(they need a LeaderWorkerSet), said in the notes.
"""
from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from optimizer.launch import host
from optimizer.serving.launch import BOOTSTRAP_PORT, DEFAULT_PORT, NIC_VARIABLE, NIXL_SIDE_CHANNEL_PORT, Endpoint, launch

IMAGE = {"vllm": "vllm/vllm-openai:v{version}", "sglang": "lmsysorg/sglang:v{version}"}


@dataclass
class Placed:
    """One worker on its server(s): ``servers`` (one per node it spans), ``devices`` per server."""

    name: str
    group: int
    role: str
    worker: Any  # optimizer.serving.perf.Worker
    servers: list[int]
    devices: list[int]
    ports: dict = field(default_factory=dict)  # engine -> {"port", "side_port" | "bootstrap_port"}


def place(p, workers, counts: dict) -> list[Placed]:
    """First-fit placement of ``counts`` ``{configuration index: workers}`` (module docstring)."""
    first = []  # the first server index of each pool
    n = 0
    for pool in p.pools:
        first.append(n)
        n += math.ceil(pool.count / pool.hw.server.gpus)
    free: dict[int, list[int]] = {}  # server -> free GPU indices
    next_server = {k: first[k] for k in range(len(p.pools))}
    out = []
    for g, (j, cnt) in enumerate(sorted(counts.items())):
        w = workers[j]
        per = p.pools[w.pool].hw.server.gpus
        for i in range(cnt):
            name = f"{w.role}-{w.layout.label().replace('/', '-').replace(' ', '').lower()}-{g}-{i}"
            if w.gpus >= per:
                span = math.ceil(w.gpus / per)
                srv = list(range(next_server[w.pool], next_server[w.pool] + span))
                next_server[w.pool] += span
                out.append(Placed(name, g, w.role, w, srv, list(range(per))))
                continue
            s = next((s for s in sorted(free) if _pool_of(first, s) == w.pool and len(free[s]) >= w.gpus), None)
            if s is None:
                s = next_server[w.pool]
                next_server[w.pool] += 1
                free[s] = list(range(per))
            dev, free[s] = free[s][:w.gpus], free[s][w.gpus:]
            out.append(Placed(name, g, w.role, w, [s], dev))
    return out


def _pool_of(first: list[int], server: int) -> int:
    return max(k for k, f in enumerate(first) if f <= server)


def assign_ports(placed: list[Placed], engine: str) -> int:
    """Give each worker its ports on its head server; returns the router's port (server 0)."""
    http: dict[int, int] = {}
    side: dict[int, int] = {}
    boot: dict[int, int] = {}
    for x in placed:
        s = x.servers[0]
        for t in x.servers:
            http.setdefault(t, DEFAULT_PORT[engine])
        port = max(http[t] for t in x.servers)
        for t in x.servers:
            http[t] = port + 1
        d = {"port": port}
        if engine == "vllm":
            side.setdefault(s, NIXL_SIDE_CHANNEL_PORT)
            d["side_port"] = side[s]
            side[s] += x.worker.layout.attention_dp
        elif x.role == "prefill":
            boot.setdefault(s, BOOTSTRAP_PORT)
            d["bootstrap_port"] = boot[s]
            boot[s] += 1
        x.ports[engine] = d
    return http.get(0, DEFAULT_PORT[engine])


def _endpoint(x: Placed, engine: str, node: int) -> Endpoint:
    d = x.ports[engine]
    return Endpoint(port=d["port"], side_port=d.get("side_port", NIXL_SIDE_CHANNEL_PORT),
                    bootstrap_port=d.get("bootstrap_port", BOOTSTRAP_PORT), host=host(x.servers[node]),
                    nodes=len(x.servers), node_rank=node, head_host=host(x.servers[0]))


def router(p, placed: list[Placed], engine: str, port: int) -> str | None:
    """The P/D router's command (None for an aggregated plan)."""
    pre = [x for x in placed if x.role == "prefill"]
    dec = [x for x in placed if x.role == "decode"]
    if not pre or not dec:
        return None
    url = lambda x: f"http://{host(x.servers[0])}:{x.ports[engine]['port']}"  # noqa: E731
    if engine == "vllm":
        args = ["python", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", "--port", str(port),
                "--prefiller-hosts", *[host(x.servers[0]) for x in pre],
                "--prefiller-ports", *[str(x.ports[engine]["port"]) for x in pre],
                "--decoder-hosts", *[host(x.servers[0]) for x in dec],
                "--decoder-ports", *[str(x.ports[engine]["port"]) for x in dec]]
    else:
        args = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for x in pre:
            args += ["--prefill", url(x), str(x.ports[engine]["bootstrap_port"])]
        for x in dec:
            args += ["--decode", url(x)]
        args += ["--host", "0.0.0.0", "--port", str(port)]
    return " ".join(f'"{a}"' if "${" in a else shlex.quote(a) for a in args)


def _script(cmd: str, x: Placed, node: int, servers: int) -> str:
    dev = ",".join(map(str, x.devices))
    return (f"#!/bin/sh\n# {x.name}: {x.role} {x.worker.layout.label()} on server {x.servers[node]}"
            + (f" (node {node} of {len(x.servers)})" if len(x.servers) > 1 else "") + "\n"
            f"# Set SERVER_0_HOST..SERVER_{servers - 1}_HOST (the servers' addresses)"
            + (f" and {NIC_VARIABLE} (the RDMA NICs, e.g. mlx5_0,mlx5_1)" if x.role != "aggregated" else "")
            + f".\nset -eu\nexport CUDA_VISIBLE_DEVICES={dev}\nexec {cmd}\n")


def write(p, placed: list[Placed], folder: Path, rate_tag: str = "") -> list[Path]:
    """``folder/deploy[_<rate>]/``: ``<engine>/<worker>.sh`` (one per worker and server), ``<engine>/router.sh``
    and ``deployment.json`` (every worker: server, devices, ports, command)."""
    from optimizer.serving.launch import engines_for

    root = folder / f"deploy{rate_tag}"
    files = []
    servers = 1 + max((s for x in placed for s in x.servers), default=0)
    doc: dict[str, Any] = {"servers": [{"index": s, "host_variable": f"SERVER_{s}_HOST"} for s in range(servers)],
                           "nic_variable": NIC_VARIABLE, "engines": {}, "notes": []}
    for engine in ("vllm", "sglang"):
        mine = [x for x in placed if engine in engines_for(p, x.worker)]
        if not mine or len(mine) < len(placed):
            continue
        rport = assign_ports(placed, engine)
        if engine == "vllm" and any(len(x.servers) > 1 for x in placed):
            doc["notes"].append("vllm: workers wider than a server need vLLM's multi-node launch (not generated)")
            continue
        d = root / engine
        d.mkdir(parents=True, exist_ok=True)
        rows = []
        for x in placed:
            for node in range(len(x.servers)):
                cmd = launch(p, x.worker, engine, _endpoint(x, engine, node))
                f = d / (f"{x.name}.sh" if len(x.servers) == 1 else f"{x.name}-node{node}.sh")
                f.write_text(_script(cmd.command(), x, node, servers))
                f.chmod(0o755)
                files.append(f)
                rows.append({"worker": x.name, "role": x.role, "layout": x.worker.layout.label(),
                             "server": x.servers[node], "node_rank": node, "devices": x.devices,
                             "cuda_visible_devices": ",".join(map(str, x.devices)), **x.ports[engine],
                             "version": cmd.version, "env": cmd.env, "command": cmd.command(), "script": str(f.name)})
        r = router(p, placed, engine, rport)
        ent: dict[str, Any] = {"version": rows[0]["version"], "workers": rows}
        if r is not None:
            f = d / "router.sh"
            f.write_text(f"#!/bin/sh\n# the P/D router, on server 0; set SERVER_0_HOST..SERVER_{servers - 1}_HOST\n"
                         + (f"# {TOY_PROXY_NOTE}\n" if engine == "vllm" else "") +
                         f"set -eu\nexec {r}\n")
            f.chmod(0o755)
            files.append(f)
            ent["router"] = {"server": 0, "port": rport, "command": r, "script": "router.sh"}
        doc["engines"][engine] = ent
    root.mkdir(parents=True, exist_ok=True)
    f = root / "deployment.json"
    f.write_text(json.dumps(doc, indent=2))
    files.append(f)
    return files


# ------------------------------------------------------------------ kubernetes
TOY_PROXY_NOTE = ("vLLM's P/D proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) is an example in "
                  "vLLM's source tree, not in the vllm-openai image: run it from a checkout of the same vLLM "
                  "version (mount it and set the working directory), or use SGLang's router")
# HF_TOKEN from a Secret named hf-token (key token) when it exists, for gated models
_HF_TOKEN = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}}]


def _k8s_name(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-")[:50]


def manifests(p, placed: list[Placed], engine: str) -> tuple[list[dict], list[str]]:
    """Kubernetes objects for ``engine`` (module docstring) and notes of what was not generated."""
    notes = []
    groups: dict[int, list[Placed]] = {}
    for x in placed:
        groups.setdefault(x.group, []).append(x)
    objs: list[dict] = []
    svc: dict[int, str] = {}
    app = _k8s_name(p.model.name)[:24].strip("-")
    for g, xs in groups.items():
        x0 = xs[0]
        if len(x0.servers) > 1:
            notes.append(f"{x0.role} {x0.worker.layout.label()}: wider than one server, needs a LeaderWorkerSet "
                         "(not generated)")
            continue
        name = _k8s_name(f"{app}-{x0.role}-{g}")
        svc[g] = name
        port = DEFAULT_PORT[engine]
        cmd = launch(p, x0.worker, engine, Endpoint(port=port, host="$(POD_IP)"))
        env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        env += [{"name": k, "value": v.replace("${" + NIC_VARIABLE + "}", "all")} for k, v in cmd.env.items()]
        args = [a.replace("${" + NIC_VARIABLE + "}", "") for a in cmd.args]
        if "--disaggregation-ib-device" in args:  # automatic detection in the pod
            k = args.index("--disaggregation-ib-device")
            del args[k:k + 2]
        labels = {"app": app, "group": name, "role": x0.role}
        lab = lambda: dict(labels)  # noqa: E731 - a copy each (no YAML anchors)
        gpus = x0.worker.gpus
        objs.append({"apiVersion": "apps/v1", "kind": "StatefulSet",
                     "metadata": {"name": name, "labels": lab()},
                     "spec": {"serviceName": name, "replicas": len(xs), "selector": {"matchLabels": lab()},
                              "template": {"metadata": {"labels": lab()},
                                           "spec": {"containers": [{
                                               "name": engine, "image": IMAGE[engine].format(version=cmd.version),
                                               "command": args, "env": env + _HF_TOKEN,
                                               "ports": [{"containerPort": port, "name": "http"}],
                                               "resources": {"limits": {"nvidia.com/gpu": gpus},
                                                             "requests": {"nvidia.com/gpu": gpus}},
                                               "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
                                               # NCCL between the pod's GPUs uses /dev/shm, 64 MiB by default in a pod
                                               "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}}})
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": lab()},
                     "spec": {"clusterIP": "None", "selector": lab(),
                              "ports": [{"name": "http", "port": port, "targetPort": port}]}})
    agg = [g for g, xs in groups.items() if g in svc and xs[0].role == "aggregated"]
    if len(agg) > 1 or (agg and len(groups[agg[0]]) > 1):
        # one Service over every aggregated pod: kube-proxy spreads connections over the workers
        name = _k8s_name(f"{app}-aggregated")
        port = DEFAULT_PORT[engine]
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": {"app": app}},
                     "spec": {"selector": {"app": app, "role": "aggregated"},
                              "ports": [{"name": "http", "port": port, "targetPort": port}]}})
        notes.append(f"Service {name}: connection-level balancing over the aggregated workers (not load-aware; "
                     "a request router such as llm-d's or SGLang's router balances by queue)")
    pre = [(g, i) for g, xs in groups.items() if g in svc and xs[0].role == "prefill" for i in range(len(xs))]
    dec = [(g, i) for g, xs in groups.items() if g in svc and xs[0].role == "decode" for i in range(len(xs))]
    if pre and dec:
        port = DEFAULT_PORT[engine]
        pod = lambda g, i: f"{svc[g]}-{i}.{svc[g]}"  # noqa: E731
        if engine == "vllm":
            args = ["python", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", "--port", str(port),
                    "--prefiller-hosts", *[pod(*k) for k in pre], "--prefiller-ports", *[str(port)] * len(pre),
                    "--decoder-hosts", *[pod(*k) for k in dec], "--decoder-ports", *[str(port)] * len(dec)]
            image = IMAGE[engine].format(version=launch(p, groups[pre[0][0]][0].worker, engine).version)
            notes.append(TOY_PROXY_NOTE)
        else:
            args = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
            for k in pre:
                args += ["--prefill", f"http://{pod(*k)}:{port}", str(BOOTSTRAP_PORT)]
            for k in dec:
                args += ["--decode", f"http://{pod(*k)}:{port}"]
            args += ["--host", "0.0.0.0", "--port", str(port)]
            image = IMAGE[engine].format(version=launch(p, groups[pre[0][0]][0].worker, engine).version)
        name = _k8s_name(f"{app}-router")
        lab = lambda: {"app": app, "group": name}  # noqa: E731
        objs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": lab()},
                     "spec": {"replicas": 1, "selector": {"matchLabels": lab()},
                              "template": {"metadata": {"labels": lab()},
                                           "spec": {"containers": [{"name": "router", "image": image, "command": args,
                                                                    "ports": [{"containerPort": port,
                                                                               "name": "http"}]}]}}}})
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": lab()},
                     "spec": {"selector": lab(), "ports": [{"name": "http", "port": port, "targetPort": port}]}})
    return objs, notes


def write_kubernetes(p, placed: list[Placed], folder: Path, rate_tag: str = "") -> list[Path]:
    """``folder/deploy[_<rate>]/kubernetes-<engine>.yaml`` per engine that runs every worker."""
    from optimizer.serving.launch import engines_for

    root = folder / f"deploy{rate_tag}"
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for engine in ("vllm", "sglang"):
        if not placed or any(engine not in engines_for(p, x.worker) for x in placed):
            continue
        objs, notes = manifests(p, placed, engine)
        f = root / f"kubernetes-{engine}.yaml"
        head = "".join(f"# {n}\n" for n in notes)
        f.write_text(head + yaml.safe_dump_all(objs, sort_keys=False))
        files.append(f)
    return files
