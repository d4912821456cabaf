"""The ``measured`` step-time source: NVIDIA's measured kernel database through ``aiconfigurator-core``.

``aiconfigurator-core`` (Apache-2.0, on PyPI) ships per-GPU, per-engine, per-version timings of
GEMMs, attention, NCCL / custom AllReduce, MoE and MLA kernels and composes them into a forward
pass (``aiconfigurator_core.sdk.compile_engine`` -> ``EngineHandle.mixed_step_latency`` /
``decode_step_latency``), and estimates the KV cache the engine will allocate
(``aiconfigurator_core.sdk.estimate_kv_cache``). The solvers never call it in their inner loops:

* **Tabulated per layout, cell by cell as lookups need them.** For each (model, GPU, engine,
  version, layout, dtypes) a table ``T[p, d, s]`` (ms) holds the step of ``p`` prefill tokens and
  ``d`` decodes at context ``s`` on one attention-DP rank, over the grids :data:`PREFILL_GRID` x
  :data:`DECODE_GRID` x :data:`CONTEXT_GRID`; lookups are trilinear interpolation (linear
  extrapolation beyond the grid, :class:`_Table`). A cell is asked of the estimator the first time
  a lookup's interpolation corners include it (a serving run touches a few hundred of the ~5,800
  cells: the whole grid took ~0.45 s per layout on the 2-core machine, on top of ~1 s to load the
  database once per process).
* **Cached on disk** in ``$SUPERNODE_CACHE_DIR`` (default ``~/.cache/supernode-optimizer``)
  ``/steptimes/<sha256>.npz`` (cells not built yet are NaN; the cells a process built are merged
  into the file at exit), keyed by the aiconfigurator-core version, the table layout version, the
  config.json bytes, GPU, engine, version, layout, dtypes and memory fraction. A table being
  started is announced on stderr.

Conventions (stated because the estimator's arguments are per rank):
* a mixed step of ``chunk`` prompt tokens after ``c0`` of the prompt, with ``b`` decodes at
  context ``s`` is ``T[chunk, b/dp, s] + T[chunk, 0, c0+chunk] - T[chunk, 0, s]`` (the chunk's
  attention at its own length), never below either part alone;
* a prompt of ``n`` tokens, ``q`` per rank, is ``T[q·n, 0, n]``;
* KV capacity: ``estimate_kv_cache`` tokens per attention-DP rank (the engine's memory fraction,
  activations at ``max_num_tokens`` = 8,192 and 256 sequences) x ``dp``; a request of
  ``context + new`` tokens takes that many.
* Kernel lanes: GEMMs in the lane of ``model.weight_dtype`` (:data:`GEMM_QUANT`: ``fp8`` is
  per-tensor FP8) unless ``performance.gemm_quant`` names another (``fp8_block`` for block-scaled
  checkpoints such as Qwen/Qwen3-32B-FP8); MoE experts in the same lane (:data:`MOE_QUANT`).
  Context attention (FMHA) in the dtype the estimator infers from the checkpoint, except that an
  inferred FP8 FMHA the database has no context table for (DeepSeek's MLA on H200/B200, FP8
  attention next to a BF16 KV cache under SGLang) is timed with the BF16 FMHA kernels over the
  same KV cache, aiconfigurator's own rule (``resolve_context_fmha_by_data``); the build says so.

Units: tokens, seconds (the estimator's milliseconds are converted here, once).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from optimizer.errors import InputError
from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel

TABLE_VERSION = 1
PREFILL_GRID = np.array([0, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
                         16384, 24576, 32768, 49152, 65536, 98304, 131072], dtype=float)
DECODE_GRID = np.array([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                        1536, 2048], dtype=float)
CONTEXT_GRID = np.array([128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072], dtype=float)
KV_MAX_NUM_TOKENS = 8192
KV_MAX_BATCH = 256
SYSTEMS_FILE = Path(__file__).resolve().parents[2] / "instances" / "hardware" / "aiconfigurator.yaml"
GEMM_QUANT = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4", "int4": "int4_wo", "int8": "int8_wo"}
KV_QUANT = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "int8": "int8"}
# the estimator's message when a checkpoint's inferred FP8 FMHA has no context-attention table; the
# engine then runs (and aiconfigurator times) BF16 FMHA over the same KV cache
# (aiconfigurator_core.sdk.models.helpers.resolve_context_fmha_by_data, which compile_engine skips)
FP8_FMHA_MISSING = 'fmha_quant: "fp8"'
# MoE experts run the GEMM lane of the weights (the estimator would otherwise infer the lane from
# config.json, BF16 for the transcribed configs, and time FP8 experts as BF16)
MOE_QUANT = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4", "int4_wo": "int4_wo"}


# table keys the estimator could not time in this process: a build is tried (and announced) once
_UNTIMED: dict = {}


class NotCovered(Exception):
    """The database cannot time this case; ``field`` is the ``performance.*`` field to blame."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


class LayoutNotTimed(InputError):
    """Under ``measured``: the database cannot time one layout (the estimator's reason, e.g. a
    block-FP8 expert shard not a multiple of the block). The serving model leaves such a layout
    out of its decision space (limit ``not_timed``) as long as another layout can be timed."""


def cache_dir() -> Path:
    """Folder of the on-disk tables: ``$SUPERNODE_CACHE_DIR`` or ``~/.cache/supernode-optimizer``."""
    root = os.environ.get("SUPERNODE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "supernode-optimizer")
    return Path(root) / "steptimes"


@lru_cache(maxsize=1)
def mapping() -> dict:
    """``instances/hardware/aiconfigurator.yaml``: ``systems`` (catalog GPU -> database system),
    ``servers`` (catalog GPU -> the server it comes in), ``model_aliases``. Read once per process."""
    with SYSTEMS_FILE.open() as fh:
        return yaml.safe_load(fh)


def systems() -> dict:
    """Catalog GPU name -> aiconfigurator-core system name (``instances/hardware/aiconfigurator.yaml``)."""
    return mapping()["systems"]


def _aic() -> str:
    """The installed aiconfigurator-core version (its metadata only: importing the package and
    its database index costs seconds, paid only when a table is built)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("aiconfigurator-core")
    except PackageNotFoundError:
        raise NotCovered("source", "needs aiconfigurator-core (pip install aiconfigurator-core)") from None
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return v


@lru_cache(maxsize=1)
def _shipped_index() -> dict:
    try:
        return json.loads((SYSTEMS_FILE.parent / "aiconfigurator_index.json").read_text())
    except (OSError, ValueError):
        return {}


def _index(aic_version: str, system: str, engine: str) -> dict:
    """``{"versions": [...], "current": str | None}`` of the database for ``engine`` on ``system``:
    from ``instances/hardware/aiconfigurator_index.json`` when it was written for the installed
    aiconfigurator-core (``python -m benchmarks.aic_index``), else computed and cached on disk per
    version (the package's own index parses ~250 YAML files, 1.3 s or more on a first run)."""
    shipped = _shipped_index()
    if shipped.get("aiconfigurator_core") == aic_version:
        return shipped["index"].get(f"{system}/{engine}", {"versions": [], "current": None})
    path = cache_dir() / f"index-{aic_version}.json"
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError):
        index = {}
    key = f"{system}/{engine}"
    if key not in index:
        from aiconfigurator_core.sdk import perf_database

        have = sorted(perf_database.get_supported_databases().get(system, {}).get(engine, []))
        slots = (perf_database.get_version_slots(system, engine) or {}) if have else {}
        index[key] = {"versions": have, "current": slots.get("current")}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, sort_keys=True))
        os.replace(tmp, path)
    return index[key]


def database_versions(system: str, engine: str) -> list[str]:
    """Versions the installed database has for ``engine`` on ``system`` (sorted)."""
    return list(_index(_aic(), system, engine)["versions"])


def resolve_version(system: str, engine: str, version: Optional[str]) -> str:
    """The literal database version for ``engine`` on ``system`` (None: the database's current one).

    Raises:
        NotCovered: the engine has no data on this GPU, or the version is not in the database
            (the message lists the versions it has).
    """
    idx = _index(_aic(), system, engine)
    have = idx["versions"]
    if not have:
        raise NotCovered("engine", f"has no {engine} timings for {system}")
    if version is None:
        return idx["current"] or have[-1]
    if version not in have:
        raise NotCovered("engine_version", f"{engine} {version} is not in the measured database for {system} "
                                           f"(it has {', '.join(have)})")
    return version


def default_memory_fraction(engine: str, version: str, capacity_bytes: float, lay: Layout) -> tuple[str, float]:
    """The engine's default memory fraction as aiconfigurator-core records it: ``(kind, value)``,
    kind ``of_total`` (vLLM ``gpu_memory_utilization`` by version, SGLang ``mem_fraction_static``
    derived from capacity and layout) or ``of_free`` (TensorRT-LLM ``free_gpu_memory_fraction``)."""
    if engine == "vllm":
        from aiconfigurator_core.sdk.backends import vllm_backend as vb

        by = vb.VLLM_GPU_MEMORY_UTILIZATION_BY_VERSION
        minor = ".".join(version.split(".")[:2])
        return "of_total", float(by.get(minor, vb.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))
    if engine == "sglang":
        from aiconfigurator_core.sdk.backends.sglang_backend import derive_sglang_mem_fraction_static

        return "of_total", float(derive_sglang_mem_fraction_static(int(capacity_bytes), lay.attention_tp, lay.pp,
                                                                   lay.attention_dp))
    from aiconfigurator_core.sdk.backends import trtllm_backend as tb

    return "of_free", float(tb.TRTLLM_DEFAULT_FREE_GPU_MEMORY_FRACTION)


def _cell(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower grid index and weight of ``x`` on a sorted grid; outside the grid the end cell's
    line is extended (linear extrapolation)."""
    i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


class _Table:
    """One layout's step table and KV capacity (see the module docstring).

    Lookups are trilinear in (prefill tokens, decodes, log context) with linear extrapolation,
    vectorised with numpy: the same rule as ``scipy.interpolate.RegularGridInterpolator(method=
    "linear", fill_value=None)``, without importing ``scipy.interpolate`` (0.7 s on the 2-core
    machine, more than the whole warm-cache budget of a command). ``t_ms`` cells that are NaN
    are not built yet: ``fill(i, j, k)`` (index arrays) returns their values, asked for the
    corners a lookup needs; ``path`` is where the table is kept (merged there at exit)."""

    def __init__(self, t_ms: np.ndarray, kv_tokens_per_rank: int, memory_fraction: tuple[str, float],
                 fill=None, path: Optional[Path] = None):
        self.t_ms = t_ms
        self.kv_tokens_per_rank = int(kv_tokens_per_rank)
        self.memory_fraction = memory_fraction
        self._log_s = np.log(CONTEXT_GRID)
        self.fill, self.path = fill, path
        self.complete = not bool(np.isnan(t_ms).any())
        self.built = 0  # cells built by this process (saved at exit)

    def _ensure(self, i, j, k) -> None:
        """Build the NaN cells among the lookups' corners (index arrays ``i, j, k``: lower corners)."""
        ii = np.concatenate([i, i + 1] * 4)
        jj = np.concatenate([j, j, j + 1, j + 1] * 2)
        kk = np.concatenate([k] * 4 + [k + 1] * 4)
        miss = np.isnan(self.t_ms[ii, jj, kk])
        if not miss.any():
            return
        cells = np.unique(np.stack([ii[miss], jj[miss], kk[miss]]), axis=1)
        self.t_ms[cells[0], cells[1], cells[2]] = self.fill(cells[0], cells[1], cells[2])
        self.built += cells.shape[1]
        self.complete = not bool(np.isnan(self.t_ms).any())
        _DIRTY[id(self)] = self

    def ms(self, p, d, s) -> np.ndarray:
        p, d, s = np.broadcast_arrays(np.atleast_1d(np.asarray(p, float)), np.atleast_1d(np.asarray(d, float)),
                                      np.atleast_1d(np.log(np.maximum(np.asarray(s, float), 1.0))))
        (i, wi), (j, wj), (k, wk) = _cell(PREFILL_GRID, p), _cell(DECODE_GRID, d), _cell(self._log_s, s)
        if not self.complete:
            self._ensure(i, j, k)
        t = self.t_ms
        out = np.zeros(p.shape)
        for di, fi in ((0, 1 - wi), (1, wi)):
            for dj, fj in ((0, 1 - wj), (1, wj)):
                for dk, fk in ((0, 1 - wk), (1, wk)):
                    out += fi * fj * fk * t[i + di, j + dj, k + dk]
        return np.maximum(out, 0.0)


_DIRTY: dict = {}  # tables with cells built by this process, saved at exit


def save_tables() -> None:
    """Merge every table's newly built cells into its cache file (run at exit; also callable)."""
    for tab in list(_DIRTY.values()):
        _save(tab)
    _DIRTY.clear()


def _save(tab: _Table) -> None:
    if tab.path is None:
        return
    t = tab.t_ms.copy()
    try:  # another process may have built other cells meanwhile: keep both
        if tab.path.exists():
            with np.load(tab.path, allow_pickle=False) as z:
                old = z["t_ms"]
            if old.shape == t.shape:
                t = np.where(np.isnan(t), old, t)
        tab.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tab.path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, t_ms=t, kv_tokens=tab.kv_tokens_per_rank, fraction_kind=tab.memory_fraction[0],
                 fraction=tab.memory_fraction[1])
        os.replace(tmp, tab.path)
    except (OSError, ValueError):  # a cache that cannot be written costs time, not results
        pass


atexit.register(save_tables)


class MeasuredSteps:
    """Step times from aiconfigurator-core's measured kernels (see the module docstring).

    Build with :meth:`open`, which checks coverage (GPU, engine, version) before any table."""

    name = "measured"

    def __init__(self, *, system: str, engine: str, version: str, aic_version: str, model_dir: Path,
                 config_sha: str, gemm: str, kv: str, model_perf: PerfModel, memory_fraction: Optional[float],
                 label: str, moe: Optional[str] = None):
        self.system, self.engine, self.version, self.aic_version = system, engine, version, aic_version
        self.model_dir, self.config_sha, self.gemm, self.kv = model_dir, config_sha, gemm, kv
        self.moe = moe  # MoE experts' lane (None: dense model)
        self.model_perf = model_perf
        self.memory_fraction = memory_fraction
        self.label = label
        self.fallback = None  # auto: the analytic source for layouts the database cannot time
        self.path, self.where = None, "performance"
        self.analytic_layouts: dict = {}  # layout -> why it fell back (auto)
        self.why = (f"measured kernels: aiconfigurator-core {aic_version} database, {engine} {version} on {system}")
        self._tables: dict = {}
        self._handles: dict = {}  # layout -> (the estimator's engine, FMHA lane), compiled on first need
        self._untimed: dict = {}  # layout -> NotCovered (the estimator is not asked twice)

    @classmethod
    def open(cls, perf, model_perf: PerfModel, config_file: Path, gpu: str, weight_dtype: str, kv_dtype: str,
             hf_id: Optional[str] = None) -> "MeasuredSteps":
        """Check coverage and return the source (tables are built on first use per layout).

        Raises:
            NotCovered: aiconfigurator-core missing, a GPU without a database, an engine version the
                database lacks, a dtype it has no kernels for, or a model it cannot time.
        """
        aic_version = _aic()
        system = systems().get(gpu)
        if system is None:
            raise NotCovered("source", f"has no timings for GPU {gpu!r} (it covers "
                                       f"{', '.join(sorted(systems()))})")
        version = resolve_version(system, perf.engine, perf.engine_version)
        gemm = getattr(perf, "gemm_quant", None) or GEMM_QUANT.get(weight_dtype)
        if gemm is None:
            raise NotCovered("source", f"has no GEMM kernels for {weight_dtype} weights")
        moe = None
        if model_perf.spec.moe is not None:
            moe = MOE_QUANT.get(gemm)
            if moe is None:
                raise NotCovered("gemm_quant", f"has no MoE kernels of the {gemm} lane")
        if kv_dtype not in KV_QUANT:
            raise NotCovered("source", f"has no attention kernels for a {kv_dtype} KV cache")
        raw = Path(config_file).read_bytes()
        sha = hashlib.sha256(raw).hexdigest()
        try:
            quantized = "quantization_config" in json.loads(raw)
        except ValueError:
            quantized = False
        if quantized and weight_dtype in ("fp8", "fp4") and not getattr(perf, "gemm_quant", None):
            # a quantized checkpoint (block FP8, NVFP4, ...) with no lane named: the estimator reads
            # its scheme (GEMMs and experts) from the config, as the engines do
            gemm, moe = None, None
        model_dir = cache_dir().parent / "models" / sha[:16]
        if not (model_dir / "config.json").exists():
            model_dir.mkdir(parents=True, exist_ok=True)
            (model_dir / "config.json").write_bytes(raw)
        src = cls(system=system, engine=perf.engine, version=version, aic_version=aic_version, model_dir=model_dir,
                  config_sha=sha, gemm=gemm, kv=KV_QUANT[kv_dtype], model_perf=model_perf,
                  memory_fraction=perf.memory_fraction, label=hf_id or Path(config_file).stem, moe=moe)
        src.path, src.where = perf.path, perf.where
        if getattr(perf, "gemm_quant", None):
            src.why += f", {gemm} GEMM kernels"
        return src

    # ---------------------------------------------------------------- tables
    def _key(self, lay: Layout) -> str:
        d = {"aic": self.aic_version, "table": TABLE_VERSION, "system": self.system, "engine": self.engine,
             "version": self.version, "config": self.config_sha, "layout": lay.as_dict(), "gemm": self.gemm,
             "kv": self.kv, "fraction": self.memory_fraction, "grids": [PREFILL_GRID.tolist(), DECODE_GRID.tolist(),
                                                                        CONTEXT_GRID.tolist()]}
        if self.moe is not None:  # dense keys unchanged (their tables do not depend on it)
            d["moe"] = self.moe
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def _parallel(self, lay: Layout) -> dict:
        moe = self.model_perf.spec.moe is not None
        return dict(tp_size=lay.attention_tp, pp_size=lay.pp, attention_dp_size=lay.attention_dp,
                    moe_tp_size=lay.experts_tp if moe else None, moe_ep_size=lay.experts_ep if moe else None,
                    moe_quant_mode=self.moe)

    def table(self, lay: Layout) -> _Table:
        """The layout's table, from memory, the disk cache, or built now (announced on stderr).

        Raises:
            NotCovered: the estimator cannot time this model/layout (its message names the operator).
        """
        t = self._tables.get(lay)
        if t is not None:
            return t
        if lay in self._untimed:
            raise self._untimed[lay]
        if lay.cp != 1 or lay.sp:
            self._untimed[lay] = NotCovered("source", f"{lay.label()}: the measured database has no context- or "
                                                      f"sequence-parallel timings")
            raise self._untimed[lay]
        per_server = self.model_perf.hw.server.gpus
        if lay.gpus > per_server:
            self._untimed[lay] = NotCovered("source", (
                f"{lay.label()} spans {lay.gpus // per_server} servers: the database's All-to-All (DeepEP) "
                f"tables are of one node, so no cross-server dispatch/combine is measured"))
            raise self._untimed[lay]
        key = self._key(lay)
        if key in _UNTIMED:  # another instance of this process already failed to build it
            self._untimed[lay] = _UNTIMED[key]
            raise self._untimed[lay]
        path = cache_dir() / f"{key}.npz"
        if path.exists():
            with np.load(path, allow_pickle=False) as z:
                t = _Table(z["t_ms"].copy(), int(z["kv_tokens"]), (str(z["fraction_kind"]), float(z["fraction"])),
                           fill=lambda i, j, k, lay=lay: self._cells(lay, i, j, k), path=path)
        else:
            try:
                t = self._build(lay, path)
            except NotCovered as exc:
                self._untimed[lay] = _UNTIMED[key] = exc
                raise
        self._tables[lay] = t
        return t

    def _source(self, lay: Layout):
        """The table of ``lay``, or (``auto``) the analytic fallback when the database cannot time it.

        Raises:
            InputError: under ``measured``, the estimator's reason (it names the operator)."""
        if lay in self.analytic_layouts:
            return None
        try:
            return self.table(lay)
        except NotCovered as exc:
            if self.fallback is None:
                raise LayoutNotTimed(self.path, f"{self.where}.{exc.field}", str(exc)) from None
            from optimizer.errors import warn_input

            warn_input(self.path, f"{self.where}.source", f"auto: {lay.label()} timed by the analytic roofline ({exc})")
            self.analytic_layouts[lay] = str(exc)
            return None

    def timing_table(self, lay: Layout) -> Optional[_Table]:
        """The layout's table, or None when ``auto`` times it by the analytic roofline (the
        database cannot; announced once). Built on first use (see :meth:`table`).

        Raises:
            LayoutNotTimed: under ``measured``, the estimator's reason."""
        return self._source(lay)

    def _handle(self, lay: Layout):
        """The estimator's compiled engine of ``lay`` and the FMHA lane it times context attention
        with (the checkpoint's, or BF16 where the database lacks its context table), cached.

        Raises:
            NotCovered: the estimator cannot time this model/layout (its message names the operator)."""
        got = self._handles.get(lay)
        if got is not None:
            return got
        from aiconfigurator_core.sdk import EngineHandle, compile_engine

        par = self._parallel(lay)
        for fmha in (None, "bfloat16"):  # the checkpoint's FMHA, then BF16 where its table is missing
            try:
                h = EngineHandle(compile_engine(str(self.model_dir), self.system, self.engine, self.version,
                                                gemm_quant_mode=self.gemm, kvcache_quant_mode=self.kv,
                                                fmha_quant_mode=fmha, **par))
                h.mixed_step_latency(256, 8, 1024, 2)
                break
            except Exception as exc:  # the estimator names the operator or table it lacks
                msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if fmha is None and FP8_FMHA_MISSING in msg:
                    continue
                raise NotCovered("source", f"cannot time {self.label} {lay.label()} with {self.engine} {self.version} "
                                           f"on {self.system}: {msg}") from None
        self._handles[lay] = (h, fmha)
        return h, fmha

    def _cells(self, lay: Layout, i, j, k) -> np.ndarray:
        """Step times (ms) of the grid cells ``(PREFILL_GRID[i], DECODE_GRID[j], CONTEXT_GRID[k])``."""
        h, _ = self._handle(lay)
        out = np.empty(len(i))
        for n, (p, d, s) in enumerate(zip(PREFILL_GRID[i], DECODE_GRID[j], CONTEXT_GRID[k])):
            if p == 0 and d == 0:
                out[n] = 0.0
            elif p == 0:
                out[n] = h.decode_step_latency(int(d), int(s), 2)
            else:
                out[n] = h.mixed_step_latency(int(p), int(d), int(s), 2)
        return out

    def _build(self, lay: Layout, path: Path) -> _Table:
        from aiconfigurator_core.sdk import estimate_kv_cache

        t0 = time.perf_counter()
        print(f"starting a measured step-time table: {self.label} {lay.label()} on {self.system} "
              f"({self.engine} {self.version}); cells are built as the search asks for them ...",
              file=sys.stderr, flush=True)
        par = self._parallel(lay)
        _, fmha = self._handle(lay)
        if fmha is not None:
            print(f"  context attention timed with BF16 FMHA kernels: the database has no FP8 ones for "
                  f"{self.engine} {self.version} on {self.system} (aiconfigurator falls back the same way)",
                  file=sys.stderr, flush=True)
        t = np.full((len(PREFILL_GRID), len(DECODE_GRID), len(CONTEXT_GRID)), np.nan)
        t[0, 0, :] = 0.0
        # the grid's far corners first: a layout the estimator cannot time at some cell is refused
        # here, whole, as when every cell was built up front, never in the middle of a search
        ends = np.array([[a, b, c] for a in (0, len(PREFILL_GRID) - 1) for b in (1, len(DECODE_GRID) - 1)
                         for c in (0, len(CONTEXT_GRID) - 1)]).T
        try:
            t[ends[0], ends[1], ends[2]] = self._cells(lay, ends[0], ends[1], ends[2])
        except Exception as exc:  # noqa: BLE001 - the estimator's own exceptions name the operator
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise NotCovered("source", f"cannot time {self.label} {lay.label()} with {self.engine} {self.version} "
                                       f"on {self.system}: {msg}") from None
        cap = self.model_perf.hw.gpu.memory_bytes
        kind, value = default_memory_fraction(self.engine, self.version, cap, lay)
        if self.memory_fraction is not None:
            value = float(self.memory_fraction)
        try:
            est = estimate_kv_cache(str(self.model_dir), self.system, self.engine, self.version,
                                    max_num_tokens=KV_MAX_NUM_TOKENS, max_batch_size=KV_MAX_BATCH,
                                    memory_fraction_kind=kind, memory_fraction_value=value,
                                    gemm_quant_mode=self.gemm, kvcache_quant_mode=self.kv, fmha_quant_mode=fmha,
                                    gpu_memory_capacity_bytes_override=int(cap), **par)
            kv_tokens = int(est["total_kv_size_tokens"])
        except ValueError:  # no KV budget left next to the weights
            kv_tokens = 0
        tab = _Table(t, kv_tokens, (kind, value), fill=lambda i, j, k: self._cells(lay, i, j, k), path=path)
        _save(tab)  # the KV capacity and memory fraction, before any cell
        print(f"  started in {time.perf_counter() - t0:.1f} s ({path}; kept across runs)", file=sys.stderr, flush=True)
        return tab

    def build_all(self, lay: Layout) -> _Table:
        """Every cell of ``lay``'s table (the benchmarks' and tests' complete tables)."""
        tab = self.table(lay)
        if not tab.complete:
            ii, jj, kk = np.nonzero(np.isnan(tab.t_ms))
            tab.t_ms[ii, jj, kk] = tab.fill(ii, jj, kk)
            tab.complete, tab.built = True, tab.built + len(ii)
            _DIRTY[id(tab)] = tab
        return tab

    # ---------------------------------------------------------------- StepTimes
    def mixed_step_s(self, lay: Layout, chunk: float, context_before: float, batch: float,
                     decode_context: float, chunk_ranks: int = 1, draft_tokens: int = 0) -> float:
        """One step from the measured tables. ``draft_tokens = k > 0`` (a speculative verify step):
        the database has no multi-query decode, so the step is timed as ``batch·(k+1)`` decodes at
        ``decode_context``: the GEMMs see the right ``batch·(k+1)`` tokens, the attention reads each
        sequence's KV ``k+1`` times instead of once (an over-estimate that grows with context)."""
        tab = self._source(lay)
        if tab is None:
            return self.fallback.mixed_step_s(lay, chunk, context_before, batch, decode_context, chunk_ranks,
                                              draft_tokens)
        batch = batch * (1 + int(draft_tokens))
        b = batch / lay.attention_dp
        s = max(decode_context, 1.0)
        if chunk <= 0:
            return float(tab.ms(0.0, b, s)[0]) * 1e-3
        own = context_before + chunk
        both, alone_own, alone_s, dec = tab.ms([chunk, chunk, chunk, 0.0], [b, 0.0, 0.0, b], [s, own, s, s])
        return float(max(both + alone_own - alone_s, alone_own, dec)) * 1e-3

    def prefill_s(self, lay: Layout, prompt_tokens: int, prompts_per_rank: int = 1) -> float:
        tab = self._source(lay)
        if tab is None:
            return self.fallback.prefill_s(lay, prompt_tokens, prompts_per_rank)
        n = float(prompt_tokens)
        return float(tab.ms(n * prompts_per_rank, 0.0, n)[0]) * 1e-3

    def max_sessions(self, lay: Layout, context: int, new: int) -> int:
        tab = self._source(lay)
        if tab is None:
            return self.fallback.max_sessions(lay, context, new)
        return (tab.kv_tokens_per_rank // max(1, int(context) + int(new))) * lay.attention_dp

    def kv_tokens(self, lay: Layout) -> int:
        """KV tokens the worker's cache holds (all attention-DP ranks)."""
        return self.table(lay).kv_tokens_per_rank * lay.attention_dp

    def memory_fraction_of(self, lay: Layout) -> tuple[str, float]:
        """``(kind, value)`` of the memory fraction the layout's KV capacity assumed."""
        return self.table(lay).memory_fraction
