"""``optimize fidelity MEASURED``: predict measured serving runs and state the error per group.

Each measured row (aiconfigurator-core's ``silicon_sample.csv`` layout: GPU system, engine and
version, model, precision, mode, ISL, OSL, concurrency, TP/PP/attention-DP/MoE TP/EP) becomes a
serving instance with a fixed plan and closed-loop traffic and is estimated by
:func:`optimizer.serving.estimate.estimate` (the same path as ``optimize estimate``), once per
source asked (``analytic``, ``measured``). Rows the product cannot run are kept with the reason.
Errors are ``|predicted / measured - 1|``; a group is (GPU, engine, model, mode); nothing is
fitted on the rows (the analytic source runs at the catalog peaks, the measured one is the
database as shipped).

With a calibration file (``optimize fidelity --calibration cal.yaml``, written by ``optimize
calibrate``) every predicted row is predicted a second time with the file's factors applied the way
an instance applies them (``performance.calibration``: :func:`optimizer.model.steptimes.resolve`
picks the row's (GPU, engine) group), so each group and the whole file have a *before* and an
*after* error. The factors apply to the source they were fitted on and to the models the file
names (:meth:`optimizer.model.steptimes.Calibration.refusal`); other rows keep their uncalibrated
prediction in the after figures, with the reason (``rows[].not_calibrated``).
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import yaml
from pydantic import Field

from optimizer.catalog import load_catalog
from optimizer.errors import InputError
from optimizer.schema_base import StrictModel

CHUNK_TOKENS = 8192  # the engines' default per-step token budget on 80-192 GB GPUs (vLLM max_num_batched_tokens
# for the API server, SGLang chunked_prefill_size, TensorRT-LLM max_num_tokens)
REQUIRED = ("system", "backend", "model_path", "mode", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")
CLIENTS_FILE = Path(__file__).resolve().parents[2] / "instances" / "fidelity" / "clients.yaml"
CLIENT_TRAFFIC = ("length_low_fraction", "start")  # serving.traffic fields a benchmark client may set
DEFINITIONS = {  # optimize fidelity --format json
    "rows[].measured.ttft_ms": "the row's measured mean time to first token, ms",
    "rows[].measured.tpot_ms": "the row's measured mean time per output token after the first, ms",
    "rows[].predicted.<source>.ttft_ms": "simulated mean TTFT of the row's configuration and closed loop under that step-time source, ms",
    "rows[].predicted.<source>.tpot_ms": "simulated mean TPOT, ms",
    "rows[].client": "the benchmark client (instances/fidelity/clients.yaml) whose traffic the row is simulated with; null: exact lengths, all users at time 0",
    "groups[].errors.<source>.ttft_median": "median of |predicted / measured - 1| of TTFT over the group's predicted rows (a fraction)",
    "groups[].errors.<source>.tpot_median": "the same for TPOT",
    "rows[].calibrated.<source>": "with --calibration: the row's simulated mean TTFT/TPOT (ms) with the file's factors applied (performance.calibration)",
    "rows[].not_calibrated.<source>": "with --calibration: why the factors were not applied to the row under that source (another source, another model)",
    "groups[].errors_after.<source>": "with --calibration: the errors over the same rows as errors.<source>, each row by its calibrated prediction where the factors apply, else its uncalibrated one; calibrated_rows: how many were calibrated",
    "overall.<source>": "median |predicted / measured - 1| of TTFT and TPOT over every predicted row (before any calibration)",
    "overall_after.<source>": "with --calibration: the same after it (rows the factors do not apply to count uncalibrated)",
}


@dataclass(frozen=True)
class Client:
    """How a measurement campaign sent its requests (``instances/fidelity/clients.yaml``)."""

    name: str
    match: "re.Pattern"
    traffic: dict


def read_clients(path: Path = CLIENTS_FILE) -> list[Client]:
    """The benchmark clients of a clients file, in order (the first match wins).

    Raises:
        InputError: not a file, a client without ``name``/``match``, a pattern that does not
            compile, a traffic field other than :data:`CLIENT_TRAFFIC` or one the serving schema
            refuses (names the client and the field).
    """
    from pydantic import ValidationError

    from optimizer.schema_base import read_yaml
    from optimizer.serving.schema import TrafficIn

    raw = read_yaml(path)
    if not isinstance(raw.get("clients"), list):
        raise InputError(path, "clients", "required: a list of {name, match, traffic}")
    out, names = [], set()
    for i, c in enumerate(raw["clients"]):
        where = f"clients[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("match"), str):
            raise InputError(path, where, "each client needs a name and a match pattern (strings)")
        extra = sorted(set(c) - {"name", "match", "source", "traffic"})
        if extra:
            raise InputError(path, f"{where}.{extra[0]}", "unknown key (name, match, source, traffic)")
        if c["name"] in names:
            raise InputError(path, f"{where}.name", f"{c['name']!r} names an earlier client too")
        names.add(c["name"])
        try:
            pat = re.compile(c["match"])
        except re.error as exc:
            raise InputError(path, f"{where}.match", f"not a regular expression ({exc})") from None
        tr = c.get("traffic") or {}
        if not isinstance(tr, dict):
            raise InputError(path, f"{where}.traffic", f"a mapping of serving.traffic fields (got {tr!r})")
        bad = [k for k in tr if k not in CLIENT_TRAFFIC]
        if bad:
            raise InputError(path, f"{where}.traffic.{bad[0]}", f"unknown field ({', '.join(CLIENT_TRAFFIC)})")
        try:
            TrafficIn.model_validate({"concurrency": 1, "isl": 2, "osl": 2, **tr})
        except ValidationError as exc:
            e = exc.errors()[0]
            raise InputError(path, f"{where}.traffic.{'.'.join(str(x) for x in e['loc'])}",
                             f"{e['msg']} (got {e.get('input')!r})") from None
        out.append(Client(c["name"], pat, dict(tr)))
    return out


def client_of(source: str, clients: list[Client]) -> Optional[Client]:
    """The first client whose pattern is found in a row's ``silicon_data_source``, or None."""
    return next((c for c in clients if c.match.search(source or "")), None)


@dataclass
class Row:
    id: str
    group: tuple
    fields: dict
    measured: dict
    predicted: dict = field(default_factory=dict)  # source -> {ttft_ms, tpot_ms}
    skipped: dict = field(default_factory=dict)  # source -> reason
    calibrated: dict = field(default_factory=dict)  # --calibration: source -> {ttft_ms, tpot_ms} with the factors
    not_calibrated: dict = field(default_factory=dict)  # --calibration: source -> why the factors were not applied

    def to_dict(self, calibration: bool = False) -> dict:
        client = self.fields.get("client")
        return {"id": self.id, "group": list(self.group), "client": client.name if client else None,
                "measured": self.measured, "predicted": self.predicted, "skipped": self.skipped,
                **({"calibrated": self.calibrated, "not_calibrated": self.not_calibrated} if calibration else {})}

    def after(self, src: str) -> dict:
        """The row's prediction under ``src`` after a calibration: calibrated where the factors
        applied, else the uncalibrated one."""
        return self.calibrated.get(src) or self.predicted[src]


def _num(v: str, path: Path, where: str, name: str, integer: bool = True):
    try:
        x = float(v)
    except ValueError:
        raise InputError(path, f"{where}.{name}", f"not a number ({v!r})") from None
    if not math.isfinite(x) or x <= 0:
        raise InputError(path, f"{where}.{name}", f"must be a positive number (got {v!r})")
    if integer and x != int(x):
        raise InputError(path, f"{where}.{name}", f"must be a whole number (got {v!r})")
    return int(x) if integer else x


# a row's weight precision (gemm_quant_mode, else precision) -> the instance's weight_dtype (None:
# the checkpoint's own); the GEMM lane itself is the estimator's, read from the checkpoint
PRECISIONS = {"": None, "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp8": "fp8",
              "fp8_block": "fp8", "fp4": "fp4", "nvfp4": "fp4", "int8": "int8", "int8_wo": "int8", "int4": "int4",
              "int4_wo": "int4"}


def read_rows(path: Path, limit: Optional[int] = None, clients: Optional[list[Client]] = None) -> list[Row]:
    """Rows of a measured file in aiconfigurator's ``silicon_sample.csv`` layout, each with the
    benchmark client that measured it (``clients``, default :func:`read_clients` of the shipped
    ``instances/fidelity/clients.yaml``; ``fields["client"]``, None when none matches).

    Raises:
        InputError: a missing column, a bad number, an unknown mode (names the row and the field).
    """
    if not path.is_file():
        raise InputError(path, "", "no such file")
    clients = read_clients() if clients is None else clients
    try:
        return _read_rows(path, limit, clients)
    except UnicodeDecodeError as exc:
        raise InputError(path, "", f"not UTF-8 text (byte {exc.start}): a CSV in the silicon_sample.csv layout, a "
                                   f"vllm bench JSON or an SGLang JSONL") from None
    except csv.Error as exc:
        raise InputError(path, "", f"not a readable CSV: {exc}") from None


def _read_rows(path: Path, limit: Optional[int], clients: list[Client]) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(path, "header", f"missing columns {', '.join(missing)} (the silicon_sample.csv layout)")
        rows = []
        for n, r in enumerate(reader, start=2):
            rid = r.get("id") or f"line {n}"
            where = f"row {rid}"
            if None in r.values() or None in r:  # csv.DictReader's marks of a short or long row
                have = len(r) - (None in r) + len(r.get(None) or []) - sum(v is None for v in r.values())
                raise InputError(path, where, f"{have} fields, the header has {len(reader.fieldnames)}")
            if r["mode"] not in ("agg", "disagg"):
                raise InputError(path, f"{where}.mode", f"unknown mode {r['mode']!r} (agg or disagg)")
            conc = r.get("batch_size") or ""
            m = {"ttft_ms": _num(r["silicon_ttft_ms"], path, where, "silicon_ttft_ms", False),
                 "tpot_ms": _num(r["silicon_tpot_ms"], path, where, "silicon_tpot_ms", False)}
            f = {"system": r["system"], "backend": r["backend"], "version": r.get("backend_version") or None,
                 "model": r["model_path"], "mode": r["mode"], "isl": _num(r["isl"], path, where, "isl"),
                 "osl": _num(r["osl"], path, where, "osl"),
                 "precision": (r.get("gemm_quant_mode") or r.get("precision") or "").strip().lower(),
                 "precision_column": "gemm_quant_mode" if (r.get("gemm_quant_mode") or "").strip() else "precision"}
            m_c = re.search(r"silicon_concurrency=(\d+)", r.get("silicon_data_source") or "")
            f["source_concurrency"] = int(m_c.group(1)) if m_c else None
            f["silicon_data_source"] = r.get("silicon_data_source") or ""
            f["client"] = client_of(f["silicon_data_source"], clients)
            for k in ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
                      *(f"{ph}_{x}" for ph in ("prefill", "decode")
                        for x in ("num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_ep_size", "batch_size"))):
                v = (r.get(k) or "").strip()
                # 0 or empty: not used by the row (dense rows carry moe_ep_size 0)
                f[k] = _num(v, path, where, k) if v and v not in ("0", "0.0") else None
            f["concurrency"] = _num(conc, path, where, "batch_size") if conc.strip() else f["source_concurrency"]
            rows.append(Row(rid, (r["system"], r["backend"], r["model_path"], r["mode"]), f, m))
            if limit is not None and len(rows) >= limit:
                break
    return rows


BENCH_KEYS = ("mean_ttft_ms", "mean_tpot_ms", "completed", "total_input_tokens", "total_output_tokens")


class BenchMappingIn(StrictModel):
    """``optimize fidelity RESULTS.json --mapping MAPPING.yaml``: what a benchmark result does not
    say about the run. ``engine_version`` is recorded; the measured source times the run with the
    database's current version of the engine, as for every fidelity row."""

    model: str = Field(min_length=1, description="config.json path, relative to the mapping file")
    gpu: str = Field(min_length=1, description="catalog GPU name")
    engine: Literal["vllm", "sglang", "trtllm"]
    engine_version: Optional[str] = None
    tp: int = Field(ge=1, le=1024)
    dp: Optional[int] = Field(default=None, ge=1, le=1024)
    ep: Optional[int] = Field(default=None, ge=1, le=1024)
    hf_id: Optional[str] = None
    dtype: Optional[Literal["bf16", "fp16", "fp8", "fp4"]] = None


def read_bench_results(path: Path, mapping_path: Path) -> list[Row]:
    """Rows of ``vllm bench serve --save-result`` JSON files (one object) or SGLang ``bench_serving``
    JSONL output (one object per line): mean TTFT / TPOT (``mean_ttft_ms``, ``mean_tpot_ms``), mean
    ISL / OSL from ``total_input_tokens`` / ``total_output_tokens`` over ``completed``, concurrency
    ``max_concurrency``. What the file does not say comes from a mapping YAML (like calibrate's):
    ``model`` (a config.json path, relative to the mapping), ``gpu`` (catalog name), ``engine``
    (vllm | sglang | trtllm), ``engine_version``, ``tp``, and optionally ``dp``, ``ep``, ``hf_id``.

    Raises:
        InputError: a missing key in a result (names the line and key), a missing mapping field, a GPU
            the database has no system for.
    """
    import json

    from optimizer.schema_base import read_utf8, read_yaml, validate

    mp = validate(BenchMappingIn, read_yaml(mapping_path), mapping_path)
    cfg, system = resolve_run(mp.model, mp.gpu, mapping_path.parent, mapping_path, "model")
    text = read_utf8(path, "a vllm bench serve JSON or an SGLang bench_serving JSONL")
    lines = [(1, text)] if path.suffix == ".json" else [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    rows = []
    for n, line in lines:
        where = f"result {n}" if path.suffix == ".json" else f"line {n}"
        try:
            o = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(path, where if path.suffix == ".jsonl" else f"line {exc.lineno}",
                             f"not JSON ({exc.msg})") from None
        if not isinstance(o, dict):
            raise InputError(path, where, f"a benchmark result is a JSON object (got {type(o).__name__})")
        for k in BENCH_KEYS:
            v = o.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
                raise InputError(path, f"{where}.{k}", f"missing or not a positive finite number (got {v!r})")
        conc = o.get("max_concurrency")
        if isinstance(conc, bool) or not isinstance(conc, int) or conc < 1:
            raise InputError(path, f"{where}.max_concurrency", "missing: only closed-loop runs "
                                                              "(--max-concurrency) are predicted")
        done = o["completed"]
        m = {"ttft_ms": o["mean_ttft_ms"], "tpot_ms": o["mean_tpot_ms"], "isl": o["total_input_tokens"] / done,
             "osl": o["total_output_tokens"] / done, "concurrency": conc}
        rows.append(make_row(str(o.get("id") or f"{path.name}:{n}"), system, mp, cfg, m))
    return rows


def resolve_run(config: str, gpu: str, base: Path, where, config_field: str, suffix: str = "") -> tuple[Path, str]:
    """``(config.json path, database system)`` of a run: ``config`` relative to ``base``, the
    catalog ``gpu`` mapped by ``instances/hardware/aiconfigurator.yaml``.

    Raises:
        InputError: (``where``, ``config_field``) a config.json that is not there; (``where``,
            ``gpu``) a GPU without a measured-database system.
    """
    from optimizer.model.measured import systems

    cfg = Path(config)
    cfg = cfg if cfg.is_absolute() else base / cfg
    if not cfg.is_file():
        raise InputError(where, config_field, f"no such config.json {cfg}{suffix}")
    system = systems().get(gpu)
    if system is None:
        raise InputError(where, "gpu", f"{gpu!r} has no measured database system "
                                       f"(instances/hardware/aiconfigurator.yaml lists {', '.join(systems())})")
    return cfg, system


def make_row(rid: str, system: str, run, cfg: Path, m: dict, fmt: Optional[str] = None):
    """The :class:`~optimizer.serving.fidelity.Row` of one closed-loop run: ``run`` has ``engine``,
    ``engine_version``, ``hf_id``, ``dtype``, ``tp``, ``dp``, ``ep``; ``m`` the means ``{ttft_ms,
    tpot_ms, isl, osl, concurrency}`` (ms, tokens); ``fmt`` the result file's format (recorded)."""
    model = run.hf_id or cfg.stem
    f = {"system": system, "backend": run.engine, "version": run.engine_version, "model": model,
         "config": str(cfg), "mode": "agg", "isl": max(1, round(m["isl"])), "osl": max(2, round(m["osl"])),
         "precision": run.dtype or "bf16", "precision_column": "dtype", "tp_size": run.tp, "pp_size": None,
         "attention_dp_size": run.dp, "moe_tp_size": None, "moe_ep_size": run.ep, "concurrency": m["concurrency"]}
    if fmt is not None:
        f["format"] = fmt
    return Row(rid, (system, run.engine, model, "agg"), f, {"ttft_ms": float(m["ttft_ms"]), "tpot_ms": float(m["tpot_ms"])})


def read_any(path: Path, mapping: Optional[Path] = None, limit: Optional[int] = None,
             clients: Optional[Path] = None) -> list[Row]:
    """Measured rows of a ``silicon_sample.csv``-layout CSV (with the benchmark clients of
    ``clients``, default the shipped ``instances/fidelity/clients.yaml``), or of vLLM / SGLang
    benchmark results (``.json`` / ``.jsonl``, with ``mapping``).

    Raises:
        InputError: as the readers; a result file without ``--mapping``.
    """
    if path.suffix in (".json", ".jsonl"):
        if mapping is None:
            raise InputError(path, "", "benchmark results need --mapping MAPPING.yaml (model, gpu, engine, tp)")
        if clients is not None:
            raise InputError("--clients", str(clients), "applies to a silicon_sample.csv-layout file (a benchmark "
                                                        "result names its own run)")
        return read_bench_results(path, mapping)[:limit]
    return read_rows(path, limit, None if clients is None else read_clients(clients))


def _mapping() -> dict:
    from optimizer.model.measured import mapping

    return mapping()


def _model_config(model: str, mapping: dict) -> Optional[Path]:
    try:
        from importlib.resources import files

        root = Path(str(files("aiconfigurator_core") / "model_configs"))
    except ModuleNotFoundError:
        return None
    for name in (model, mapping.get("model_aliases", {}).get(model)):
        if name:
            p = root / f"{name.replace('/', '--')}_config.json"
            if p.is_file():
                return p
    return None


def instance_of(row: Row, source: str, mapping: dict) -> tuple[Optional[dict], str]:
    """The serving instance (raw dict) that predicts ``row`` under ``source``, or None and why not."""
    f = row.fields
    if f["backend"] not in ("vllm", "sglang", "trtllm"):
        return None, f"backend {f['backend']}: no scheduler model (vllm, sglang, trtllm)"
    if f["osl"] < 2:
        return None, f"osl {f['osl']}: no decode step, so no TPOT to predict"
    gpu = next((g for g, s in mapping["systems"].items() if s == f["system"]), None)
    if gpu is None:
        return None, f"GPU system {f['system']} is not in instances/hardware/aiconfigurator.yaml"
    disagg = f["mode"] != "agg"
    if f["concurrency"] is None:
        return None, "no concurrency (batch_size, or silicon_concurrency= in silicon_data_source)"
    if not disagg and f["tp_size"] is None:
        return None, "no tp_size"
    pps = [f.get(k) or 1 for k in (("prefill_pp_size", "decode_pp_size") if disagg else ("pp_size",))]
    if any(pp != 1 for pp in pps):
        return None, "pipeline parallel rows are not predicted (serving layouts are pp = 1)"
    cfg = Path(f["config"]) if f.get("config") else _model_config(f["model"], mapping)
    if cfg is None:
        return None, f"no config.json for {f['model']} (aiconfigurator-core model_configs or model_aliases)"
    if f["precision"] not in PRECISIONS:
        return None, (f"{f['precision_column']} {f['precision']!r}: unknown weight precision "
                      f"({', '.join(k for k in PRECISIONS if k)}, or empty)")
    # empty: the checkpoint's own precision, BF16 unless the model id names FP8
    dtype = PRECISIONS[f["precision"]] or ("fp8" if "fp8" in f["model"].lower() else "bf16")
    def worker(role: str, pre: str, count: int) -> dict:
        w = {"role": role, "tp": f[f"{pre}tp_size"], "dp": f[f"{pre}attention_dp_size"] or 1, "count": count}
        if f[f"{pre}moe_ep_size"]:
            w["ep"] = f[f"{pre}moe_ep_size"]
        return w

    if disagg:
        if not (f["prefill_tp_size"] and f["decode_tp_size"]):
            return None, "a disaggregated row without prefill_tp_size and decode_tp_size"
        if not (f["prefill_num_workers"] and f["decode_num_workers"]):  # no default: 1 would be a guess
            return None, "a disaggregated row without prefill_num_workers and decode_num_workers"
        workers = [worker("prefill", "prefill_", f["prefill_num_workers"]),
                   worker("decode", "decode_", f["decode_num_workers"])]
    else:
        workers = [worker("aggregated", "", 1)]
    gpus = sum(w["tp"] * w["dp"] * w["count"] for w in workers)
    per_server = int(load_catalog()["servers"][mapping["servers"][gpu]]["gpus"])
    raw = {"name": row.id,
           # the KV cache: the serving schema's default (model.kv_dtype: BF16, vLLM's and SGLang's
           # "auto" for a checkpoint without a KV scheme) except TensorRT-LLM with FP8 weights,
           # whose engine configurations (aiconfigurator's, kv_cache_config.dtype) store it in FP8
           "model": {"config": str(cfg), "hf_id": f["model"], "weight_dtype": dtype,
                     **({"kv_dtype": "fp8"} if f["backend"] == "trtllm" and dtype == "fp8" else {})},
           "hardware": {"gpu": gpu, "server": mapping["servers"][gpu], "servers": max(1, -(-gpus // per_server))},
           "serving": {"traffic": {"concurrency": f["concurrency"], "isl": f["isl"], "osl": max(f["osl"], 2),
                                   **(f["client"].traffic if f.get("client") else {})},
                       "slo": {"ttft_ms": 1e6, "tpot_ms": 1e6}, "chunk_tokens": CHUNK_TOKENS,
                       "fixed": {"workers": workers}},
           "performance": {"source": source}}
    if disagg and f.get("decode_batch_size"):  # the decode workers' configured batch (per attention-DP rank)
        raw["serving"]["max_batch"] = int(f["decode_batch_size"]) * (f["decode_attention_dp_size"] or 1)
    raw["performance"]["engine"] = f["backend"]  # the engine's scheduler for both sources
    return raw, ""


def _row_field(field: str, disagg: bool) -> Optional[str]:
    """The CSV column behind an instance field of :func:`instance_of`'s workers (``tp_size``, or
    ``prefill_tp_size`` / ``decode_tp_size`` of a disaggregated row; ``layout`` for a whole worker)."""
    m = re.fullmatch(r"serving\.fixed\.workers\[(\d)\](\.tp)?", field or "")
    if m is None:
        return None
    if not m.group(2):
        return "layout"
    return (("prefill_", "decode_")[int(m.group(1))] if disagg else "") + "tp_size"


def read_calibration_option(path: Path):
    """The :class:`~optimizer.model.steptimes.Calibration` of ``--calibration FILE``.

    Raises:
        InputError: no such file (names ``--calibration``), a bad file (names its field)."""
    from optimizer.model.steptimes import read_calibration

    return read_calibration(path, "--calibration", "")


def predict(rows: list[Row], sources: tuple[str, ...], path: Path, calibration: Optional[Path] = None) -> list[Row]:
    """Fill ``row.predicted[source]`` (TTFT and TPOT means, ms) or ``row.skipped[source]``; with a
    ``calibration`` file, also ``row.calibrated[source]`` (the same row with the file's factors,
    through ``performance.calibration``) or ``row.not_calibrated[source]`` (why not: the factors
    were fitted on another source, or on other models).

    Raises:
        InputError: a calibration file that is not there or cannot be read."""
    from optimizer.errors import take_warnings
    from optimizer.serving import load_problem

    cal = None if calibration is None else read_calibration_option(calibration)
    cal_file = None if calibration is None else str(calibration.resolve())
    mapping = _mapping()

    def run(raw: dict, src: str):
        try:
            p = load_problem(raw, path)
            if src == "measured" and p.pools[0].steps.name != "measured":
                raise InputError(path, "", p.pools[0].steps.why)
            return _estimate(p), None
        except InputError as exc:
            field_ = _row_field(exc.field, len(raw["serving"]["fixed"]["workers"]) > 1)
            return None, (f"{field_}: {exc.problem}" if field_ else exc.problem)
        finally:
            take_warnings()

    for row in rows:
        for src in sources:
            raw, why = instance_of(row, src, mapping)
            if raw is None:
                row.skipped[src] = why
                continue
            got, why = run(raw, src)
            if got is None:
                row.skipped[src] = why
                continue
            row.predicted[src] = got
            if cal is None:
                continue
            why = (f"{cal.file} was fitted on the {cal.base} source" if cal.base != src else
                   cal.refusal(((raw["model"]["hf_id"], ""),), "this row's model"))
            if why:
                row.not_calibrated[src] = why
                continue
            raw["performance"]["calibration"] = cal_file
            got, why = run(raw, src)
            if got is None:
                row.not_calibrated[src] = f"calibrated: {why}"
            else:
                row.calibrated[src] = got
    return rows


def _estimate(p) -> dict:
    """Mean TTFT and TPOT (ms) of a fixed plan's closed-loop estimate."""
    from optimizer.serving.estimate import estimate

    e = estimate(p)[0].sim
    return {"ttft_ms": e.ttft_s["mean"] * 1e3, "tpot_ms": e.tpot_s["mean"] * 1e3}


def _errors(got: list[Row], src: str, after: bool = False) -> dict:
    """``n`` and the median and mean of ``|predicted / measured - 1|`` of TTFT and TPOT over ``got``
    (``after``: each row's prediction after a calibration, :meth:`Row.after`, and ``calibrated_rows``)."""
    pick = (lambda r: r.after(src)) if after else (lambda r: r.predicted[src])  # noqa: E731
    out = {"n": len(got)}
    for k in ("ttft", "tpot"):
        e = np.array([abs(pick(r)[f"{k}_ms"] / r.measured[f"{k}_ms"] - 1) for r in got])
        out[f"{k}_median"], out[f"{k}_mean"] = float(np.median(e)), float(e.mean())
    if after:
        out["calibrated_rows"] = sum(src in r.calibrated for r in got)
    return out


def groups(rows: list[Row], sources: tuple[str, ...], calibrated: bool = False) -> list[dict]:
    """Per (GPU, engine, model, mode) group and source: rows, median and mean absolute error of TTFT
    and TPOT (``errors``); with ``calibrated``, the same after the calibration (``errors_after``)."""
    out = []
    for g in sorted({r.group for r in rows}):
        members = [r for r in rows if r.group == g]
        d = {"system": g[0], "engine": g[1], "model": g[2], "mode": g[3], "rows": len(members), "errors": {}}
        if calibrated:
            d["errors_after"] = {}
        for src in sources:
            got = [r for r in members if src in r.predicted]
            if got:
                d["errors"][src] = _errors(got, src)
                if calibrated:
                    d["errors_after"][src] = _errors(got, src, after=True)
        out.append(d)
    return out


def overall(rows: list[Row], sources: tuple[str, ...], keep=lambda r: True, after: bool = False) -> dict:
    """``n`` and the median absolute TTFT/TPOT error per source over the rows ``keep`` selects
    (``after``: after a calibration, with ``calibrated_rows``)."""
    out = {}
    for src in sources:
        got = [r for r in rows if keep(r) and src in r.predicted]
        if got:
            e = _errors(got, src, after)
            out[src] = {k: e[k] for k in ("n", "ttft_median", "tpot_median", "calibrated_rows") if k in e}
    return out


def plot(rows: list[Row], sources: tuple[str, ...], out_dir: Path) -> Path:
    """Predicted-vs-measured scatter of TTFT and TPOT per source (log axes), ``fidelity.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")):
        lo, hi = math.inf, 0.0
        for src in sources:
            pts = [(r.measured[key], r.predicted[src][key]) for r in rows if src in r.predicted]
            if pts:
                x, y = zip(*pts)
                ax.scatter(x, y, s=8, alpha=0.6, label=src)
                lo, hi = min(lo, min(x), min(y)), max(hi, max(x), max(y))
        ax.set_xscale("log")
        ax.set_yscale("log")
        if hi > 0:  # one scale on both axes, so distance from the diagonal reads as the error
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            ax.set_xlim(lo / 1.3, hi * 1.3)
            ax.set_ylim(lo / 1.3, hi * 1.3)
            ax.set_aspect("equal")
        ax.set_xlabel(f"measured {title}")
        ax.set_ylabel(f"predicted {title}")
        ax.legend()
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fidelity.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
