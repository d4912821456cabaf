"""Calibrate the shared performance model's efficiency factors to published throughput.

Input: a CSV with the columns of :data:`COLUMNS` (one measured static batch per row: ``batch``
prompts of ``isl`` tokens prefilled together, then ``osl - 1`` decode steps of the whole batch;
``output_tokens_per_s`` = batch x osl / total time, TensorRT-LLM's definition), and a mapping of the
CSV's model and GPU names to model configs and catalog hardware (:func:`read_mapping`).

Prediction (per row, pp = 1, TP = ``tp``): one prefill pass of ``batch·isl`` tokens
(:func:`optimizer.model.prefill.forward_pass`, causal pairs ``batch·isl(isl+1)/2``), then one decode
step per output token after the first at context ``isl + k`` (k = 1..osl-1,
:func:`~optimizer.model.prefill.mixed_step_s` with no chunk). Every pass is computed once at peak and
kept as its three parts (HBM time ``m``, compute time ``c``, collective time ``n``, s); at
efficiencies ``(e_c, e_m, e_n)`` a pass takes ``max(m/e_m, c/e_c) + n/e_n`` — exactly
:func:`forward_pass` for a one-stage layout — so a fit needs no new model evaluations.

Fit: ``scipy.optimize.least_squares`` on the log ratios ``log(predicted/measured)`` with the
factors bounded to ``[1e-3, 1]``, from the all-ones start and ``starts - 1`` seeded uniform random
starts (``numpy.random.default_rng(seed)``); the lowest cost wins (first on ties), so the fit is
reproducible. Leave-one-out: each row predicted with the factors fitted on the others.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from optimizer.errors import InputError

ABOVE_PEAK = 10.0  # a row measured above this many times its peak-efficiency prediction is refused
COLUMNS = ("model", "gpu", "dtype", "tp", "batch", "isl", "osl", "output_tokens_per_s")
FACTORS = ("compute", "memory", "network")
LOWER = 1e-3


@dataclass
class Row:
    """One measurement and its peak-efficiency pass parts (s): ``parts`` shape [passes, 3] as
    (memory, compute, network)."""

    line: int
    model: str
    gpu: str
    dtype: str
    tp: int
    batch: int
    isl: int
    osl: int
    measured: float
    parts: Optional[np.ndarray] = None
    skipped: str = ""

    def predict(self, eff) -> float:
        """Output tokens/s at efficiencies ``eff = (compute, memory, network)``."""
        ec, em, en = eff
        m, c, n = self.parts[:, 0], self.parts[:, 1], self.parts[:, 2]
        t = float(np.sum(np.maximum(m / em, c / ec) + n / en))
        return self.batch * self.osl / t

    def prefill_share(self) -> float:
        """Share of the peak-efficiency time spent in the prefill pass."""
        t = np.maximum(self.parts[:, 0], self.parts[:, 1]) + self.parts[:, 2]
        return float(t[0] / t.sum())


@dataclass
class Fit:
    factors: tuple[float, float, float]
    cost: float
    rms_log_error: float
    starts: int
    seed: int


@dataclass
class Calibration:
    rows: list[Row]
    fit: Fit
    loo: list[Optional[float]] = field(default_factory=list)  # predicted tokens/s per row (None: skipped)

    @property
    def used(self) -> list[Row]:
        return [r for r in self.rows if not r.skipped]

    def loo_errors(self) -> list[float]:
        return [abs(p / r.measured - 1) for r, p in zip(self.rows, self.loo) if p is not None]

    @property
    def loo_median_abs_error(self) -> float | None:
        e = self.loo_errors()
        return float(np.median(e)) if e else None

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for r, loo in zip(self.rows, self.loo):
            d = {"line": r.line, "model": r.model, "gpu": r.gpu, "dtype": r.dtype, "tp": r.tp, "batch": r.batch,
                 "isl": r.isl, "osl": r.osl, "measured_tokens_per_s": r.measured}
            if r.skipped:
                d["skipped"] = r.skipped
            else:
                peak = r.predict((1.0, 1.0, 1.0))
                fit = r.predict(self.fit.factors)
                d.update({"predicted_peak": peak, "ratio_peak": peak / r.measured, "predicted_fitted": fit,
                          "ratio_fitted": fit / r.measured, "predicted_leave_one_out": loo,
                          "ratio_leave_one_out": None if loo is None else loo / r.measured,
                          "prefill_share_of_time": r.prefill_share()})
            rows.append(d)
        return {"factors": dict(zip(FACTORS, self.fit.factors)), "cost": self.fit.cost,
                "rms_log_error": self.fit.rms_log_error, "starts": self.fit.starts, "seed": self.fit.seed,
                "leave_one_out_median_abs_error": self.loo_median_abs_error, "rows": rows}


# ----------------------------------------------------------------------------- input
def read_measurements(path: Path) -> list[Row]:
    """Rows of a measurements CSV (columns :data:`COLUMNS`, any order, extra columns ignored).

    Raises:
        InputError: missing file, missing columns, a non-numeric or non-positive number on a line.
    """
    if not path.is_file():
        raise InputError(path, "", "measurements file not found")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise InputError(path, "header", "empty file (expected a header line)") from None
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise InputError(path, "header", f"missing columns: {', '.join(missing)} (expected {', '.join(COLUMNS)})")
        ix = {c: header.index(c) for c in COLUMNS}
        rows = []
        for n, rec in enumerate(reader, start=2):
            if not rec or all(not c.strip() for c in rec):
                continue
            if len(rec) != len(header):  # a field too many is a shifted or mistyped line, never dropped
                raise InputError(path, f"line {n}", f"expected {len(header)} columns as in the header (got {len(rec)})")
            vals = {c: rec[ix[c]].strip() for c in COLUMNS}
            nums = {}
            for c in ("tp", "batch", "isl", "osl"):
                try:
                    nums[c] = int(vals[c])
                except ValueError:
                    raise InputError(path, f"line {n}.{c}", f"expected a whole number (got {vals[c]!r})") from None
                if nums[c] < 1:
                    raise InputError(path, f"line {n}.{c}", f"must be at least 1 (got {nums[c]})")
            try:
                meas = float(vals["output_tokens_per_s"])
            except ValueError:
                raise InputError(path, f"line {n}.output_tokens_per_s",
                                 f"expected a number (got {vals['output_tokens_per_s']!r})") from None
            if not (math.isfinite(meas) and meas > 0):
                raise InputError(path, f"line {n}.output_tokens_per_s", f"must be a positive number (got {meas!r})")
            rows.append(Row(n, vals["model"], vals["gpu"], vals["dtype"].lower(), nums["tp"], nums["batch"],
                            nums["isl"], nums["osl"], meas))
    if not rows:
        raise InputError(path, "", "no measurement rows")
    return rows


def _no_unknown_keys(path: Path, prefix: str, section: dict, known: tuple) -> None:
    """Refuse a key of a mapping file's ``section`` outside ``known`` (a typo must not be dropped);
    keys starting with ``_`` are notes (``_source``)."""
    for key in section:
        if key not in known and not str(key).startswith("_"):
            raise InputError(path, f"{prefix}{key}", f"unknown key (expected {', '.join(known)})")


def read_mapping(specs: list[str], hardware: list[str], where: str = "--model") -> tuple[dict, dict]:
    """``({csv model: config path}, {csv gpu: (catalog gpu, catalog server)})`` from ``--model`` values
    (a mapping YAML with ``models:`` and optional ``hardware:`` sections, paths relative to it, or
    ``NAME=CONFIG.json``) and ``--hardware`` values (``NAME=GPU:SERVER`` catalog names; ``GPU:SERVER``
    alone applies to every row).

    Raises:
        InputError: a value in neither form, a missing file (the mapping or a config it names),
            a mapping without ``models``, an unknown key in it.
    """
    from optimizer.schema_base import read_yaml

    models: dict[str, Path] = {}
    hw: dict[str, tuple[str, str]] = {}
    for s in specs:
        if "=" in s:
            name, cfg = s.split("=", 1)
            p = Path(cfg)
            if not p.is_file():
                raise InputError(where, name, f"model config not found: {p}")
            models[name.strip()] = p
            continue
        p = Path(s)
        if not p.is_file():
            raise InputError(where, "", f"expected a mapping YAML or NAME=CONFIG.json (no file {s!r})")
        raw = read_yaml(p)
        if not isinstance(raw, dict) or not isinstance(raw.get("models"), dict):
            raise InputError(p, "models", "a mapping file needs a 'models:' section {csv name: {config: path}}")
        _no_unknown_keys(p, "", raw, ("models", "hardware"))
        for name, m in raw["models"].items():
            if not isinstance(m, dict) or not isinstance(m.get("config"), str):
                raise InputError(p, f"models.{name}.config", "required field is missing (path to a config.json)")
            _no_unknown_keys(p, f"models.{name}.", m, ("config",))
            cfg = (p.parent / m["config"]).resolve()
            if not cfg.is_file():
                raise InputError(p, f"models.{name}.config", f"model config file not found: {cfg}")
            models[str(name)] = cfg
        if raw.get("hardware") is not None and not isinstance(raw["hardware"], dict):
            raise InputError(p, "hardware", "expected a mapping {csv gpu name: {gpu, server}}")
        for name, h in (raw.get("hardware") or {}).items():
            if not isinstance(h, dict) or not isinstance(h.get("gpu"), str) or not isinstance(h.get("server"), str):
                raise InputError(p, f"hardware.{name}", "needs gpu and server (catalog names)")
            _no_unknown_keys(p, f"hardware.{name}.", h, ("gpu", "server"))
            hw[str(name)] = (h["gpu"], h["server"])
    for s in hardware:
        name, _, val = s.rpartition("=")
        gpu, sep, server = val.partition(":")
        if not sep or not gpu or not server:
            raise InputError("--hardware", s, "expected [CSVNAME=]GPU:SERVER (catalog names)")
        from optimizer.catalog import check_gpu_in_server, lookup

        lookup("gpus", gpu, "--hardware", s)  # unknown names are one-line errors here, not silently unused
        lookup("servers", server, "--hardware", s)
        check_gpu_in_server(gpu, server, "--hardware", s)
        hw[name.strip() or "*"] = (gpu, server)
    return models, hw


# ----------------------------------------------------------------------------- model
def prepare(rows: list[Row], models: dict, hw: dict, csv_path: Path) -> None:
    """Compute every usable row's pass parts; rows the model cannot predict get ``skipped``
    (unknown name, unsupported architecture, TP that does not divide the heads, a batch whose KV
    does not fit)."""
    from optimizer.catalog import lookup
    from optimizer.model.config import read_hf_config
    from optimizer.model.decode import DTYPE_BYTES
    from optimizer.model.hardware import Hardware, LinkSpec, ServerSpec, gpu_spec_from_catalog
    from optimizer.model.layout import Layout
    from optimizer.model.perf import PerfModel
    from optimizer.model.prefill import PEAK, chunk_attention_pairs, forward_pass, mixed_step_s

    GB = 1e9
    specs: dict[str, Any] = {}
    for r in rows:
        if r.model not in models:
            r.skipped = f"model {r.model!r} not mapped (give --model {r.model}=CONFIG.json or a mapping file)"
            continue
        h = hw.get(r.gpu) or hw.get("*")
        if h is None:
            r.skipped = f"gpu {r.gpu!r} not mapped (give --hardware {r.gpu}=GPU:SERVER)"
            continue
        if r.dtype not in DTYPE_BYTES:
            raise InputError(csv_path, f"line {r.line}.dtype", f"unknown dtype {r.dtype!r} (one of {', '.join(DTYPE_BYTES)})")
        if r.model not in specs:
            try:
                specs[r.model] = read_hf_config(models[r.model])
            except InputError as exc:
                specs[r.model] = exc
        spec = specs[r.model]
        if isinstance(spec, InputError):
            r.skipped = f"{models[r.model].name}: {spec.field}: {spec.problem.split(' (')[0]}"
            continue
        g = lookup("gpus", h[0], csv_path, "--hardware")
        s = lookup("servers", h[1], csv_path, "--hardware")
        if r.tp > int(s["gpus"]):
            r.skipped = f"TP {r.tp} exceeds the {s['gpus']} GPUs of {h[1]}"
            continue
        link = lambda d: LinkSpec(d["bandwidth_gb_s"] * GB, d["latency_us"] * 1e-6)  # noqa: E731
        hwm = Hardware(gpu_spec_from_catalog(h[0], g),
                       ServerSpec(h[1], int(s["gpus"]), link(s["scale_up"]), link(s["scale_out"])))
        perf = PerfModel(spec, hwm, DTYPE_BYTES[r.dtype], DTYPE_BYTES[r.dtype], 0.0, weight_dtype=r.dtype, kv_dtype=r.dtype)
        lay = Layout.tp(r.tp)
        try:
            perf.check(lay)
        except Exception as exc:  # noqa: BLE001 - a layout the model rejects is a skipped row
            why = exc.problem if isinstance(exc, InputError) else str(exc)  # not the nested "error: <input>:" line
            r.skipped = f"layout TP{r.tp} not valid for {r.model}: {why}"
            continue
        if perf.max_sessions(lay, r.isl, r.osl) < r.batch:  # the model cannot run it: not fitted
            r.skipped = (f"batch {r.batch} at {r.isl + r.osl} tokens exceeds the KV memory the model allows "
                         f"({perf.max_sessions(lay, r.isl, r.osl)} sessions)")
            continue
        b, n = float(r.batch), float(r.isl)
        pre = forward_pass(perf, lay, b * n, b * n, b * chunk_attention_pairs(n, 0.0), PEAK)
        parts = [(pre.local_s, pre.compute_s, pre.comm_s)]
        for k in range(1, r.osl):
            # decode step k: the batch's tokens at position isl+k-1 read isl+k tokens of KV
            ctx = n + k
            d = forward_pass(perf, lay, b, b * ctx, b * ctx, PEAK)
            parts.append((d.local_s, d.compute_s, d.comm_s))
        r.parts = np.asarray(parts)
        peak = r.predict((1.0, 1.0, 1.0))
        if r.measured > ABOVE_PEAK * peak:  # a typo (a fresh user's 1e308 was fitted as given)
            raise InputError(csv_path, f"line {r.line}.output_tokens_per_s",
                             f"{r.measured:g} tok/s is more than {ABOVE_PEAK:g}x the peak model's {peak:.6g} tok/s "
                             f"(every efficiency 1) for {r.model} TP{r.tp} on {h[0]}: not a measurement of this row")
        if r.osl > 1:  # consistency with the model's own decode step (mixed_step_s with no chunk)
            last = mixed_step_s(perf, lay, 0.0, 0.0, b, n + r.osl - 1, PEAK)
            assert abs(last - (max(parts[-1][0], parts[-1][1]) + parts[-1][2])) <= 1e-9 * last


def _residuals(x, rows: list[Row]) -> np.ndarray:
    return np.array([math.log(r.predict(x) / r.measured) for r in rows])


def fit(rows: list[Row], seed: int = 0, starts: int = 8) -> Fit:
    """Least-squares fit of (compute, memory, network) efficiencies on log ratios (module docstring).

    Raises:
        ValueError: no usable rows.
    """
    from scipy.optimize import least_squares

    use = [r for r in rows if not r.skipped]
    if not use:
        raise ValueError("no rows the model can predict")
    rng = np.random.default_rng(seed)
    x0s = [np.ones(3)] + [rng.uniform(0.05, 1.0, 3) for _ in range(max(0, starts - 1))]
    best = None
    for x0 in x0s:
        res = least_squares(_residuals, x0, args=(use,), bounds=([LOWER] * 3, [1.0] * 3), method="trf",
                            xtol=1e-12, ftol=1e-12, gtol=1e-12)
        if best is None or res.cost < best.cost - 1e-12:
            best = res
    x = tuple(float(v) for v in best.x)
    rms = float(np.sqrt(np.mean(_residuals(x, use) ** 2)))
    return Fit(x, float(best.cost), rms, len(x0s), seed)


def calibrate(rows: list[Row], seed: int = 0, starts: int = 8) -> Calibration:
    """Fit on every usable row, then leave-one-out (each row predicted with a fit on the others)."""
    f = fit(rows, seed, starts)
    loo: list[Optional[float]] = []
    use = [r for r in rows if not r.skipped]
    for r in rows:
        if r.skipped or len(use) < 2:
            loo.append(None)
            continue
        f_r = fit([q for q in use if q is not r], seed, starts)
        loo.append(r.predict(f_r.factors))
    return Calibration(rows, f, loo)


def yaml_fragment(cal: Calibration, source: str) -> str:
    """``efficiency:`` block for ``serving.efficiency`` (paste or include under ``serving:``)."""
    c, m, n = cal.fit.factors
    med = cal.loo_median_abs_error
    return (f"# fitted by `optimize calibrate` on {source}: {len(cal.used)} rows, RMS log error "
            f"{cal.fit.rms_log_error:.3f}, leave-one-out median |error| "
            f"{'n/a' if med is None else f'{med:.1%}'}\n"
            f"efficiency:\n  compute: {c:.6f}\n  memory: {m:.6f}\n  network: {n:.6f}\n")


def render(cal: Calibration, console) -> None:
    from rich.table import Table

    t = Table(title="predicted / measured output tokens/s")
    for h in ("line", "model", "TP", "batch", "ISL", "OSL", "measured", "peak", "ratio", "fitted", "ratio",
              "leave-one-out", "ratio", "prefill share"):
        t.add_column(h)
    for r, loo in zip(cal.rows, cal.loo):
        if r.skipped:
            t.add_row(str(r.line), r.model, str(r.tp), str(r.batch), str(r.isl), str(r.osl), f"{r.measured:g}",
                      "skipped", "", "", "", "", "", "")
            continue
        pk, ft = r.predict((1, 1, 1)), r.predict(cal.fit.factors)
        t.add_row(str(r.line), r.model, str(r.tp), str(r.batch), str(r.isl), str(r.osl), f"{r.measured:g}",
                  f"{pk:.0f}", f"{pk / r.measured:.2f}", f"{ft:.0f}", f"{ft / r.measured:.2f}",
                  "" if loo is None else f"{loo:.0f}", "" if loo is None else f"{loo / r.measured:.2f}",
                  f"{r.prefill_share():.0%}")
    console.print(t)
    for r in cal.rows:
        if r.skipped:
            console.print(f"line {r.line} ({r.model}) skipped: {r.skipped}")
    c, m, n = cal.fit.factors
    console.print(f"fitted efficiencies: compute {c:.4f}, memory {m:.4f}, network {n:.4f} "
                  f"(least squares on log ratios, {cal.fit.starts} starts, seed {cal.fit.seed}); "
                  f"residual: cost {cal.fit.cost:.4g}, RMS log error {cal.fit.rms_log_error:.4f}")
    med = cal.loo_median_abs_error
    if med is not None:
        console.print(f"leave-one-out median |predicted/measured - 1|: {med:.1%}")
