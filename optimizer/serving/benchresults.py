"""Measured serving runs from the benchmark clients' own result files, for ``optimize calibrate``.

Formats, told apart by their content (never by the file name), with the fields read (units as the
tools write them; field names from the tools' sources):

* ``silicon_sample`` - aiconfigurator-core's CSV (:func:`optimizer.serving.fidelity.read_rows`).
* ``vllm`` - ``vllm bench serve --save-result`` JSON (one object, ``vllm/benchmarks/serve.py``):
  ``mean_ttft_ms``, ``mean_tpot_ms`` (ms), ``completed``, ``total_input_tokens``,
  ``total_output_tokens`` (tokens), ``max_concurrency``; recognised by ``date`` + ``endpoint_type``
  or ``model_id``/``tokenizer_id``.
* ``sglang`` - SGLang ``python -m sglang.bench_serving --output-file F.jsonl`` (one object per run
  and line, ``python/sglang/bench_serving.py``): the same metric names as vLLM's;
  recognised by ``dataset_name`` without vLLM's ``date``. Its lines may hold ``Infinity``
  (``request_rate: inf``), which Python's ``json`` reads.
* ``aiperf`` - ``profile_export_aiperf.json`` (``aiperf/common/models/export_models.py``
  ``JsonExportData``): ``time_to_first_token.avg``, ``inter_token_latency.avg`` (ms; aiperf's
  ITL is TPOT's definition, (latency - TTFT) / (OSL - 1) per request), ISL from
  ``input_sequence_length.avg`` or ``total_isl.avg / request_count.avg``, OSL from
  ``output_sequence_length.avg``, concurrency ``input_config.loadgen.concurrency``; recognised by
  ``aiperf_version`` or ``input_config.loadgen``.
* ``genai-perf`` - ``profile_export_genai_perf.json`` (``genai_perf/export_data/json_exporter.py``:
  the statistics plus ``input_config``): the same metric records as aiperf's, concurrency
  ``input_config.perf_analyzer.stimulus.concurrency`` (``input_config.concurrency`` in older
  versions).

A result file does not say what ran it: the GPU, the engine, TP (and DP, EP), the model's
config.json and the weights' dtype come from a :class:`RunIn` (``optimize calibrate`` options or a
runs YAML, :func:`read_runs`). Every row becomes a :class:`optimizer.serving.fidelity.Row`.

Errors (:class:`~optimizer.errors.InputError`, one line naming the file and field): an unknown
format, a missing or non-positive metric, an open-loop run (no concurrency), a missing run field.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field

from optimizer.errors import InputError
from optimizer.schema_base import StrictModel, read_utf8

FORMATS = ("silicon_sample", "vllm", "sglang", "aiperf", "genai-perf", "throughput")
TOOL = {"vllm": "vllm bench serve", "sglang": "SGLang bench_serving", "aiperf": "aiperf",
        "genai-perf": "genai-perf"}
RUN_FIELDS = ("config", "gpu", "engine", "tp")  # what no result file records and every run needs


class RunIn(StrictModel):
    """What a benchmark result file does not say about the run (``optimize calibrate`` options or
    one entry of a runs file)."""

    config: Optional[str] = Field(default=None, min_length=1, description="model config.json path")
    gpu: Optional[str] = Field(default=None, min_length=1, description="catalog GPU name (h100-sxm)")
    engine: Optional[Literal["vllm", "sglang", "trtllm"]] = None
    tp: Optional[int] = Field(default=None, ge=1, le=1024)
    dp: Optional[int] = Field(default=None, ge=1, le=1024)
    ep: Optional[int] = Field(default=None, ge=1, le=1024)
    hf_id: Optional[str] = Field(default=None, min_length=1, description="HuggingFace id (names the model)")
    dtype: Optional[Literal["bf16", "fp16", "fp8", "fp4"]] = None
    engine_version: Optional[str] = None


class RunFileIn(RunIn):
    file: str = Field(min_length=1, description="result file, relative to the runs file")


class RunsIn(StrictModel):
    """A runs file: ``defaults`` for every run, ``runs`` one entry per result file."""

    defaults: RunIn = RunIn()
    runs: list[RunFileIn] = Field(min_length=1)


def read_runs(path: Path, cli: RunIn) -> list[tuple[Path, RunIn, Path]]:
    """``(result file, run fields, where the config path is relative to)`` for every run of a runs
    YAML; a run's own fields win over the file's ``defaults``, which win over the command line's.

    Raises:
        InputError: a missing runs file, an unknown key, a bad value (names the field).
    """
    from optimizer.schema_base import read_yaml, validate

    if not path.is_file():
        raise InputError(path, "", "no such runs file")
    doc = validate(RunsIn, read_yaml(path), path)
    base = cli.model_dump(exclude_none=True) | doc.defaults.model_dump(exclude_none=True)
    out = []
    for r in doc.runs:
        f = Path(r.file)
        out.append((f if f.is_absolute() else path.parent / f,
                    RunIn(**(base | r.model_dump(exclude_none=True, exclude={"file"}))), path.parent))
    return out


def detect(path: Path) -> str:
    """The format of a result file, from its content (module docstring): one of :data:`FORMATS`.

    Raises:
        InputError: a missing or unreadable file, or content of no known tool.
    """
    text = read_utf8(path, "not a result file of a known tool")
    head = text.lstrip()[:1]
    if head in ("{", "["):
        objs = _objects(path, text)
        kinds = {_kind(o) for o in objs}
        if len(kinds) == 1 and None not in kinds:
            return kinds.pop()
        raise InputError(path, "", "not a result file of a known tool (vllm bench serve --save-result JSON, SGLang "
                                   "bench_serving JSONL, aiperf or genai-perf profile export JSON, silicon_sample.csv)")
    first = text.splitlines()[0] if text.strip() else ""
    if "," in first:
        cols = [c.strip() for c in next(csv.reader([first]))]
        return "silicon_sample" if "silicon_ttft_ms" in cols else "throughput"
    raise InputError(path, "", "not a result file of a known tool (vllm bench serve --save-result JSON, SGLang "
                               "bench_serving JSONL, aiperf or genai-perf profile export JSON, silicon_sample.csv)")


def _objects(path: Path, text: str) -> list:
    """One JSON document, or JSON lines (SGLang appends one object per run)."""
    try:
        doc = json.loads(text)
        return [doc] if isinstance(doc, dict) else [None]
    except json.JSONDecodeError:
        pass
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                o = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(path, f"line {n}", f"not JSON ({exc.msg})") from None
            out.append(o if isinstance(o, dict) else None)
    return out or [None]


def _kind(o) -> Optional[str]:
    if not isinstance(o, dict):
        return None
    if any(k in o for k in ("mean_ttft_ms", "mean_tpot_ms", "median_ttft_ms", "median_itl_ms")):
        if "date" in o and "endpoint_type" in o or "model_id" in o or "tokenizer_id" in o:
            return "vllm"
        if "dataset_name" in o or "backend" in o:  # also SGLang's 2024 lines (medians, no means)
            return "sglang"
        return None
    if isinstance(o.get("time_to_first_token"), dict):
        ic = o.get("input_config") if isinstance(o.get("input_config"), dict) else {}
        if "aiperf_version" in o or "loadgen" in ic:
            return "aiperf"
        if "perf_analyzer" in ic or "concurrency" in ic or "genai_perf_version" in o:
            return "genai-perf"
    return None


def _pos(path: Path, where: str, v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
        raise InputError(path, f"{where}{name}", f"missing or not a positive number (got {v!r})")
    return float(v)


def _stat(path: Path, where: str, o: dict, name: str, unit: Optional[str] = None) -> float:
    rec = o.get(name)
    if not isinstance(rec, dict):
        raise InputError(path, f"{where}{name}", "missing (a {unit, avg, ...} record)")
    if unit is not None and rec.get("unit") not in (None, unit):
        raise InputError(path, f"{where}{name}.unit", f"expected {unit!r} (got {rec.get('unit')!r})")
    return _pos(path, where, rec.get("avg"), f"{name}.avg")


def measurements(path: Path, fmt: str) -> list[dict]:
    """Per run in the file: ``{where, ttft_ms, tpot_ms, isl, osl, concurrency}`` (means; ms, tokens).

    Raises:
        InputError: a missing or non-positive field (names the line or result and the field), an
            open-loop run (no concurrency: only closed-loop runs are predicted).
    """
    objs = _objects(path, path.read_text(encoding="utf-8"))
    out = []
    for n, o in enumerate(objs, 1):
        where = f"line {n}." if fmt == "sglang" else ""
        if fmt in ("vllm", "sglang"):
            c = o.get("max_concurrency")  # an open-loop run is refused before its metrics are read
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                rate = o.get("request_rate")
                raise InputError(path, f"{where}max_concurrency", f"missing (got {c!r}{f', request_rate {rate!r}' if rate is not None else ''}): "
                                                                  f"only closed-loop runs (--max-concurrency) are predicted")
            done = _pos(path, where, o.get("completed"), "completed")
            m = {"ttft_ms": _pos(path, where, o.get("mean_ttft_ms"), "mean_ttft_ms"),
                 "tpot_ms": _pos(path, where, o.get("mean_tpot_ms"), "mean_tpot_ms"),
                 "isl": _pos(path, where, o.get("total_input_tokens"), "total_input_tokens") / done,
                 "osl": _pos(path, where, o.get("total_output_tokens"), "total_output_tokens") / done,
                 "concurrency": o.get("max_concurrency")}
            cname = "max_concurrency"
        else:
            ic = o.get("input_config") if isinstance(o.get("input_config"), dict) else {}
            m = {"ttft_ms": _stat(path, where, o, "time_to_first_token", "ms"),
                 "tpot_ms": _stat(path, where, o, "inter_token_latency", "ms"),
                 "osl": _stat(path, where, o, "output_sequence_length")}
            if isinstance(o.get("input_sequence_length"), dict):
                m["isl"] = _stat(path, where, o, "input_sequence_length")
            else:
                m["isl"] = _stat(path, where, o, "total_isl") / _stat(path, where, o, "request_count")
            if fmt == "aiperf":
                m["concurrency"], cname = (ic.get("loadgen") or {}).get("concurrency"), "input_config.loadgen.concurrency"
            else:
                stim = ((ic.get("perf_analyzer") or {}).get("stimulus") or {})
                m["concurrency"] = stim.get("concurrency", ic.get("concurrency"))
                cname = "input_config.perf_analyzer.stimulus.concurrency"
        c = m["concurrency"]
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise InputError(path, f"{where}{cname}", f"missing (got {c!r}): only closed-loop runs (a fixed "
                                                      f"concurrency) are predicted")
        m["where"] = where.rstrip(".") or "result"
        out.append(m)
    return out


def rows_of(path: Path, fmt: str, run: RunIn, base: Path, source_of_run: str) -> list:
    """:class:`~optimizer.serving.fidelity.Row` objects of a benchmark result file with its run's fields.

    ``base``: the folder a relative ``config`` is taken from; ``source_of_run``: where the run fields
    came from (``--gpu ...`` or a runs file), for messages.

    Raises:
        InputError: a missing run field (names the result file and the field), a config.json that is
            not there, a GPU without a measured-database system, as :func:`measurements`.
    """
    missing = [f for f in RUN_FIELDS if getattr(run, f) is None]
    if missing:
        raise InputError(path, missing[0], f"required: {TOOL[fmt]} does not record it (give --{missing[0]} or "
                                           f"set it in a runs file{'; also missing: ' + ', '.join(missing[1:]) if missing[1:] else ''})")
    from optimizer.serving.fidelity import make_row, resolve_run

    cfg, system = resolve_run(run.config, run.gpu, base, source_of_run, "config", f" (for {path.name})")
    rows = []
    for i, m in enumerate(measurements(path, fmt)):
        rid = f"{path.name}" + (f":{i + 1}" if fmt == "sglang" else "")
        rows.append(make_row(rid, system, run, cfg, m, fmt))
    return rows

