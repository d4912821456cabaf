"""Step-time sources behind the one performance model: ``analytic`` (the chapter's roofline) or
``measured`` (NVIDIA's measured kernel database through ``aiconfigurator-core``).

Every problem that times forward passes asks a :class:`StepTimes` object, never the roofline or
the database directly, so a plan is timed by one source and says which:

* :meth:`StepTimes.mixed_step_s` - one continuous-batching step: a prefill chunk of ``chunk``
  tokens (after ``context_before`` tokens of its prompt) on each of the first ``chunk_ranks``
  attention-DP ranks plus ``batch`` running decodes, each reading ``decode_context`` tokens of KV;
  with ``draft_tokens = k > 0`` each decode is a speculative verify of ``k + 1`` query tokens
  (analytic: :func:`optimizer.model.prefill.mixed_step_s`; measured: the database's step at
  ``batch·(k+1)`` decodes, see :meth:`optimizer.model.measured.MeasuredSteps.mixed_step_s`);
* :meth:`StepTimes.prefill_s` - a whole prompt in one pass;
* :meth:`StepTimes.max_sessions` - how many requests of ``context + new`` tokens the worker's KV
  cache holds, as the engine allows it (the engine's memory fraction under ``measured``; eq. 6-1
  with the fixed reserve under ``analytic``).

Units: tokens, seconds. The source is chosen per instance by ``performance.source``
(:func:`resolve`): ``analytic``, ``measured`` or ``auto`` (measured where the database covers the
GPU, engine and model, analytic otherwise; :attr:`StepTimes.why` says which and why).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel
from optimizer.model.prefill import PEAK, Efficiency, mixed_step_s, prefill_s

SOURCES = ("auto", "analytic", "measured", "chapter")
ANALYTIC = ("analytic", "chapter")  # the names of the roofline sources (AnalyticSteps)
CHAPTER_WHY = "the reference chapter's roofline (eq. 6-2) at the catalog's datasheet peaks"
ENGINES = ("vllm", "sglang", "trtllm")


class StepTimes(Protocol):
    """A source of forward-pass times and KV capacity for one model on one GPU type."""

    name: str  # "chapter" | "analytic" | "measured" (ANALYTIC: the two rooflines)
    why: str  # one sentence: which source timed the plan and why (engine, version, database)

    def mixed_step_s(self, lay: Layout, chunk: float, context_before: float, batch: float,
                     decode_context: float, chunk_ranks: int = 1, draft_tokens: int = 0) -> float: ...

    def prefill_s(self, lay: Layout, prompt_tokens: int, prompts_per_rank: int = 1) -> float: ...

    def max_sessions(self, lay: Layout, context: int, new: int) -> int: ...


@dataclass(frozen=True)
class AnalyticSteps:
    """The chapter's roofline (eq. 6-2) with alpha-beta collectives, scaled by ``eff``
    (:mod:`optimizer.model.prefill`); memory by eq. 6-1 with the fixed per-GPU reserve."""

    perf: PerfModel
    eff: Efficiency = PEAK
    why: str = "analytic roofline (eq. 6-2) at the catalog's peaks"
    name: str = "analytic"

    def mixed_step_s(self, lay, chunk, context_before, batch, decode_context, chunk_ranks=1, draft_tokens=0):
        return mixed_step_s(self.perf, lay, chunk, context_before, batch, decode_context, self.eff, chunk_ranks,
                            draft_tokens)

    def prefill_s(self, lay, prompt_tokens, prompts_per_rank=1):
        return prefill_s(self.perf, lay, prompt_tokens, self.eff, prompts_per_rank)

    def max_sessions(self, lay, context, new):
        return self.perf.max_sessions(lay, context, new)


@dataclass(frozen=True)
class Performance:
    """The resolved ``performance:`` block of an instance.

    Attributes:
        source: ``auto`` (the default), ``measured``, ``analytic`` (the roofline on fitted
            achieved peaks, :mod:`optimizer.model.efficiency`) or ``chapter`` (the roofline at the
            datasheet peaks, as the reference chapter).
        engine: ``vllm``, ``sglang`` or ``trtllm`` (the engine the measured kernels are of).
        engine_version: a version of the database, or None for the database's current one.
        memory_fraction: the engine's memory fraction (vLLM ``gpu_memory_utilization``, SGLang
            ``mem_fraction_static``: of total memory; TensorRT-LLM ``free_gpu_memory_fraction``:
            of the memory left after the weights), or None for the engine's default.
        gemm_quant: the database's GEMM kernel lane (``fp8`` per-tensor, ``fp8_block`` the
            block-scaled FP8 of checkpoints such as Qwen/Qwen3-32B-FP8, ...), or None for the lane of
            ``model.weight_dtype``; MoE experts use the same lane.
        path: the instance file (for messages); where: the field prefix (``performance``).
    """

    source: str = "auto"
    engine: str = "vllm"
    engine_version: Optional[str] = None
    memory_fraction: Optional[float] = None
    path: Optional[Path] = None
    where: str = "performance"
    calibration: Optional["Calibration"] = None
    gemm_quant: Optional[str] = None


def kv_token_budget(steps: StepTimes, lay: Layout, probe_tokens: int = 1024) -> tuple[float, float]:
    """The KV cache of one worker as an engine's block manager sees it: ``(T, S)``, where a set of
    running requests with ``tokens`` KV tokens in all fits while ``tokens + S * requests <= T``.

    ``S`` is the fixed per-request state in KV-token equivalents: zero for attention-only models,
    the recurrent state of the linear-attention layers for hybrid ones (Qwen3.5 / Qwen3-Next Gated
    DeltaNet, a per-sequence state whatever the context). Read off the source's own memory model
    through ``max_sessions`` at two contexts, which for eq. 6-1 (and the measured source's token
    capacity, ``S = 0``) is ``floor(T / (context + S))``: ``n1 = n(1)``, ``n2 = n(probe)`` give
    ``S = (n2 * probe - n1) / (n1 - n2)`` (clamped at 0) and ``T = n1 * (1 + S)``. The floors make
    ``S`` exact to about ``probe / (n1 - n2)`` tokens.

    Returns ``(0, 0)`` when not even one request of one token fits."""
    n1 = steps.max_sessions(lay, 1, 0)
    if n1 <= 0:
        return 0.0, 0.0
    n2 = steps.max_sessions(lay, probe_tokens, 0)
    if n2 <= 0 or n2 >= n1:
        return float(n1), 0.0
    state = max(0.0, (n2 * probe_tokens - n1) / (n1 - n2))
    return n1 * (1.0 + state), state


def performance_from_input(pin, default_engine: str, path: Path, where: str = "performance") -> Performance:
    """The resolved ``performance:`` block of an instance (``pin``: a
    :class:`optimizer.schema_base.PerformanceIn`); the engine defaults to ``default_engine``;
    ``calibration`` is read relative to the instance file.

    Raises:
        InputError: a measured-only field under ``source: analytic``; a bad calibration file.
    """
    from optimizer.errors import InputError

    if pin.source in ANALYTIC:
        for field_ in ("engine_version", "memory_fraction", "gemm_quant"):
            if getattr(pin, field_) is not None:
                raise InputError(path, f"{where}.{field_}", "applies to the measured source only "
                                                             f"({where}.source: measured or auto)")
    cal = None
    if pin.calibration is not None:
        f = Path(pin.calibration)
        cal = read_calibration(f if f.is_absolute() else path.parent / f, path, f"{where}.calibration")
    return Performance(pin.source, pin.engine or default_engine, pin.engine_version, pin.memory_fraction, path, where,
                       cal, pin.gemm_quant)


def resolve(perf: Performance, model_perf: PerfModel, config_file: Path, gpu: str, eff: Efficiency = PEAK,
            weight_dtype: str = "bf16", kv_dtype: str = "bf16", hf_id: Optional[str] = None) -> StepTimes:
    """The step-time source an instance asks for.

    ``measured`` builds (or loads from the disk cache) one table per layout on first use
    (:class:`optimizer.model.measured.MeasuredSteps`); ``auto`` falls back to ``analytic`` when
    the database does not cover the GPU, the engine version or the model, with a one-line
    warning naming why.

    A calibration file (``perf.calibration``) that records the models it was fitted on
    (``models:``) is refused for another model (:meth:`Calibration.refusal`, the model named as
    :func:`model_names` says); a file without ``models:`` (older files, hand-written ones) applies
    to any model.

    Raises:
        InputError: under ``measured``, a GPU, engine version or model the database cannot time
            (the message names the versions it has, or the operator it lacks); a calibration file
            fitted on other models, or on another source.
    """
    if perf.calibration is not None:
        wrong = perf.calibration.refusal(model_names(config_file, hf_id))
        if wrong:
            from optimizer.errors import InputError

            raise InputError(perf.path, f"{perf.where}.calibration", wrong)
    src = _resolve(perf, model_perf, config_file, gpu, eff, weight_dtype, kv_dtype, hf_id)
    if perf.calibration is None:
        return src
    from optimizer.model.measured import systems

    cal = perf.calibration.for_group(systems().get(gpu), perf.engine)
    if cal.base != src.name:
        from optimizer.errors import InputError

        raise InputError(perf.path, f"{perf.where}.calibration", f"{cal.file} was fitted on the "
                                                               f"{cal.base} source, this plan is timed by "
                                                               f"the {src.name} source")
    return CalibratedSteps(src, cal)


def roofline_only(perf: Performance, field: str, what: str) -> Performance:
    """``perf`` for an instance that asks for ``what``, a term of the roofline the measured database
    does not time (two micro-batches, an AllReduce algorithm): under ``auto`` the analytic source
    (said in a warning naming ``field``), under ``analytic``/``chapter`` unchanged.

    Raises:
        InputError: under ``measured`` (``field`` applies to the analytic sources only)."""
    from dataclasses import replace

    from optimizer.errors import InputError, warn_input

    if perf.source in ANALYTIC:
        return perf
    if perf.source == "measured":
        raise InputError(perf.path, field, f"{what}: timed by the analytic sources only (the measured database "
                                           f"times its own collectives and one batch per step); "
                                           f"performance.source is measured")
    warn_input(perf.path, field, f"{what}: timed by the analytic roofline on fitted peaks (performance.source auto; "
                                 f"the measured database times its own collectives and one batch per step)")
    return replace(perf, source="analytic")


def analytic_steps(perf: Performance, model_perf: PerfModel, gpu: str, eff: Efficiency = PEAK,
                   why: str = "") -> AnalyticSteps:
    """The analytic source of ``perf``: under ``chapter`` the roofline at the datasheet peaks;
    otherwise on the GPU's achieved peaks fitted to the measured database
    (:func:`optimizer.model.efficiency.fitted_efficiency`, the GPU's generation for a GPU the
    database lacks; the peaks, said so, when the file has neither). ``eff`` (serving's
    ``efficiency:``) divides on top. ``why`` prefixes the reason (auto's fallback)."""
    if perf.source == "chapter":
        return AnalyticSteps(model_perf, eff, why=CHAPTER_WHY, name="chapter")
    from optimizer.model.efficiency import derated, fitted_efficiency

    f = fitted_efficiency(gpu, perf.engine)
    lead = f"analytic roofline{why}"
    if f is None:
        return AnalyticSteps(model_perf, eff, why=f"{lead} at the catalog's datasheet peaks (no fitted efficiency "
                                                  f"for {gpu})")
    hw = derated(model_perf.hw, f.compute, f.memory, f.network)
    return AnalyticSteps(model_perf.with_hardware(hw), eff,
                         why=f"{lead} at achieved peaks (compute {f.compute:.2f}, memory {f.memory:.2f}, network "
                             f"{f.network:.2f} of the datasheet's; {f.why})")


def _resolve(perf, model_perf, config_file, gpu, eff, weight_dtype, kv_dtype, hf_id):
    if perf.source in ANALYTIC:
        return analytic_steps(perf, model_perf, gpu, eff)
    analytic = analytic_steps(perf, model_perf, gpu, eff, " (auto, where the database cannot time a layout)")
    from optimizer.errors import InputError, warn_input
    from optimizer.model import measured

    try:
        src = measured.MeasuredSteps.open(perf, model_perf, config_file, gpu, weight_dtype, kv_dtype, hf_id)
        if perf.source == "auto":
            src.fallback = analytic
        return src
    except measured.NotCovered as exc:
        # an engine version the user named and the database lacks is a mistake to report, not a
        # case for auto's fallback (the launch commands of that version would not exist either)
        if perf.source == "measured" or exc.field == "engine_version":
            raise InputError(perf.path, f"{perf.where}.{exc.field}", str(exc)) from None
        warn_input(perf.path, f"{perf.where}.source",
                   f"auto: timed by the analytic roofline on fitted peaks ({exc})")
        return analytic_steps(perf, model_perf, gpu, eff, f" (auto: the measured database {exc})")


@dataclass(frozen=True)
class Calibration:
    """Per-phase factors fitted to measured serving runs (``optimize calibrate``), applied on top of
    a source: the prefill part of a step (what a step with the chunk costs beyond the same step
    without it) times ``prefill``, the decode part times ``decode``, plus ``overhead_s`` per step
    (scheduler, sampling, launch). ``file``: where they were read from."""

    prefill: float = 1.0
    decode: float = 1.0
    overhead_s: float = 0.0
    base: str = "measured"
    file: str = ""
    band: Optional[dict] = None  # the file's leave-one-group-out error (rows, ttft/tpot median abs. error)
    groups: tuple = ()  # per (GPU system, engine): ((system, engine), prefill, decode, overhead_s, note)
    models: tuple = ()  # the models the factors were fitted on

    def for_group(self, system: Optional[str], engine: str) -> "Calibration":
        """The factors of ``(system, engine)`` under ``groups`` (the top-level prior elsewhere)."""
        from dataclasses import replace

        for key, pf, dc, oh, note in self.groups:
            if key == (system, engine):
                return replace(self, prefill=pf, decode=dc, overhead_s=oh, groups=(),
                               file=self.file + (f" [{system}, {engine}" + (f"; {note}]" if note else "]")))
        return replace(self, groups=())

    def refusal(self, names: tuple, who: str = "this instance's model") -> Optional[str]:
        """Why the factors do not apply to a model going by ``names`` (:func:`model_names`:
        ``(name, where the name came from)`` pairs), or None: the file records the models it was
        fitted on (``models:``) and none of ``names`` is among them (:func:`same_model`). A file
        without ``models:`` applies to any model."""
        if not self.models or any(same_model(n, m) for n, _ in names for m in self.models):
            return None
        given = " or ".join(n + (f" ({how})" if how else "") for n, how in names) or "not named"
        return f"{self.file} was fitted on {', '.join(self.models)}; {who} is {given}"


def same_model(a: str, b: str) -> bool:
    """Two model names name one model: equal ignoring case, or, when one has no organisation
    (a config file's name, ``qwen3-32b``), equal to the other's name after its ``/``
    (``Qwen/Qwen3-32B``)."""
    a, b = a.strip().lower(), b.strip().lower()
    if a == b:
        return True
    return ("/" not in a or "/" not in b) and a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def model_names(config_file: Optional[Path], hf_id: Optional[str]) -> tuple:
    """The names an instance's model goes by, as ``optimize calibrate`` records a run's model
    (its HuggingFace id, else its config file's name): ``model.hf_id`` when given; else the
    config.json's ``_name_or_path`` (when it has one) and the config file's name (its stem).
    Each is ``(name, where it came from)``."""
    if hf_id:
        return ((hf_id, "model.hf_id"),)
    if config_file is None:
        return ()
    out = []
    try:
        import json

        nop = json.loads(Path(config_file).read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        nop = None
    if isinstance(nop, str) and nop.strip():
        out.append((nop.strip(), f"_name_or_path of {Path(config_file).name}"))
    out.append((Path(config_file).stem, "the config file's name; no model.hf_id"))
    return tuple(out)


@dataclass(frozen=True)
class CalibratedSteps:
    """A source with :class:`Calibration` factors applied (memory as the base source's)."""

    base: object
    cal: Calibration

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def why(self) -> str:
        c = self.cal
        return (f"{self.base.why}, calibrated ({c.file}: prefill x{c.prefill:.3g}, decode x{c.decode:.3g}, "
                f"+{c.overhead_s * 1e3:.3g} ms per step)")

    def mixed_step_s(self, lay, chunk, context_before, batch, decode_context, chunk_ranks=1, draft_tokens=0):
        k = draft_tokens
        if self.cal.prefill == self.cal.decode:  # one factor on the whole step, no split: at 1, 1, 0 the base's step exactly
            if chunk > 0:
                full = self.base.mixed_step_s(lay, chunk, context_before, batch, decode_context, chunk_ranks, k)
            else:
                full = self.base.mixed_step_s(lay, 0.0, 0.0, batch, decode_context, 1, k) if batch > 0 else 0.0
            return self.cal.decode * full + self.cal.overhead_s
        dec = self.base.mixed_step_s(lay, 0.0, 0.0, batch, decode_context, 1, k) if batch > 0 else 0.0
        full = self.base.mixed_step_s(lay, chunk, context_before, batch, decode_context, chunk_ranks, k) if chunk > 0 else dec
        return self.cal.decode * dec + self.cal.prefill * (full - dec) + self.cal.overhead_s

    def prefill_s(self, lay, prompt_tokens, prompts_per_rank=1):
        return self.cal.prefill * self.base.prefill_s(lay, prompt_tokens, prompts_per_rank) + self.cal.overhead_s

    def max_sessions(self, lay, context, new):
        return self.base.max_sessions(lay, context, new)


def read_calibration(path: Path, instance: Optional[Path], field: str = "performance.calibration") -> Calibration:
    """The factors of a calibration file written by ``optimize calibrate --output`` (YAML with
    ``calibration: {source, prefill, decode, overhead_ms}``, optional ``groups`` per (GPU, engine)
    and ``models``, the models the factors were fitted on: absent, the file applies to any model).

    Raises:
        InputError: a missing file, a missing or non-positive factor, ``models`` not a list of names.
    """
    import math

    import yaml

    from optimizer.errors import InputError

    if not path.is_file():
        raise InputError(instance, field, f"no such calibration file {path}")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        c = doc["calibration"]
        vals = {k: float(c[k]) for k in ("prefill", "decode", "overhead_ms")}
        base = str(c.get("source", "measured"))
        held = c.get("leave_one_group_out")
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise InputError(path, "calibration", f"expected calibration: {{source, prefill, decode, overhead_ms}} "
                                              f"({type(exc).__name__}: {exc})") from None
    for k, v in vals.items():
        if not math.isfinite(v) or v < 0 or (k != "overhead_ms" and v == 0):
            raise InputError(path, f"calibration.{k}", f"must be a {'non-negative' if k == 'overhead_ms' else 'positive'} "
                                                       f"number (got {v})")
    if base not in ("analytic", "measured"):
        raise InputError(path, "calibration.source", f"unknown source {base!r} (analytic or measured)")
    groups = []
    try:
        for i, g in enumerate(c.get("groups") or []):
            groups.append(((str(g["gpu_system"]), str(g["engine"])), float(g["prefill"]), float(g["decode"]),
                           float(g["overhead_ms"]) * 1e-3, g.get("note")))
            if not all(math.isfinite(v) and v > 0 for v in groups[-1][1:3]) or not groups[-1][3] >= 0:
                raise ValueError(f"groups[{i}]: factors must be positive, the overhead non-negative")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(path, "calibration.groups", f"expected [{{gpu_system, engine, prefill, decode, overhead_ms}}] "
                                                     f"({type(exc).__name__}: {exc})") from None
    band = None
    if isinstance(held, dict) and held.get("ttft_median_abs_error") is not None:
        band = {"rows": held.get("rows"), "ttft_median_abs_error": held["ttft_median_abs_error"],
                "tpot_median_abs_error": held["tpot_median_abs_error"], "from": f"{path.name} (leave one group out)"}
    models = c.get("models")
    if models is None:
        models = []
    if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
        raise InputError(path, "calibration.models", f"expected a list of model names (HuggingFace ids or config "
                                                     f"names), got {models!r}")
    return Calibration(vals["prefill"], vals["decode"], vals["overhead_ms"] * 1e-3, base, path.name, band,
                       tuple(groups), tuple(m.strip() for m in models))
