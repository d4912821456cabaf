"""``optimize calibrate MEASURED.csv``: per-phase factors fitted to measured serving runs, with the
leave-one-group-out error that says how well they carry to configurations not fitted on.

Rows are read as :mod:`optimizer.serving.fidelity` reads them (aiconfigurator-core's
``silicon_sample.csv`` layout) and each is simulated once by the same closed-loop estimate. The
simulator splits every request's TTFT and TPOT into the prefill and decode parts of the steps
inside it, their count and the rest (:attr:`optimizer.serving.simulate.SimResult.linear`), so at
factors ``(k_prefill, k_decode, overhead)`` a row's mean TTFT and TPOT are, to first order,
``k_prefill·P + k_decode·D + overhead·N + R`` (:class:`optimizer.model.steptimes.Calibration`).

Fit: ``scipy.optimize.least_squares`` on ``log(predicted / measured)`` of TTFT and TPOT over the
rows, factors bounded to [0.05, 20] and the overhead to [0, 50] ms, from (1, 1, 0).
Leave one group out: for each (GPU, engine, model) group, the factors fitted on the *other* groups
time that group's rows in a fresh simulation (not the linearisation), so the error reported is the
error on a configuration the fit has not seen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np

from optimizer.errors import InputError
from optimizer.model.steptimes import CalibratedSteps, Calibration
from optimizer.serving.fidelity import Row, _mapping, instance_of

BOUNDS = ((0.05, 0.05, 0.0), (20.0, 20.0, 50.0))  # k_prefill, k_decode, overhead_ms


@dataclass
class Fitted:
    prefill: float
    decode: float
    overhead_ms: float
    rows: int

    def calibration(self, base: str, file: str = "") -> Calibration:
        return Calibration(self.prefill, self.decode, self.overhead_ms * 1e-3, base, file)


@dataclass
class RunCalibration:
    source: str
    rows: list
    fit: Fitted
    groups: list = field(default_factory=list)  # per group: rows, uncalibrated and held-out errors, factors
    skipped: dict = field(default_factory=dict)

    def _pooled(self, kind: str) -> dict:
        t = [e for g in self.groups for e in g[f"{kind}_ttft"]]
        return {"rows": len(t), **_med(t, [e for g in self.groups for e in g[f"{kind}_tpot"]])}

    def held_out(self) -> dict:
        """Median absolute held-out TTFT / TPOT error over every row predicted by another group's fit."""
        return self._pooled("held_out")

    def uncalibrated(self) -> dict:
        """The same over the uncalibrated predictions."""
        return self._pooled("uncalibrated")

    def to_dict(self) -> dict:
        return {"problem": "calibrate-serving", "source": self.source,
                "factors": {"prefill": self.fit.prefill, "decode": self.fit.decode, "overhead_ms": self.fit.overhead_ms},
                "fitted_rows": self.fit.rows, "uncalibrated": self.uncalibrated(), "leave_one_group_out": self.held_out(),
                "groups": [{k: v for k, v in g.items() if not k.startswith(("held_out_", "uncalibrated_"))}
                           | {"uncalibrated": _med(g["uncalibrated_ttft"], g["uncalibrated_tpot"]),
                              "held_out": _med(g["held_out_ttft"], g["held_out_tpot"])} for g in self.groups],
                "skipped": self.skipped}

    def yaml_text(self, measured: str) -> str:
        import yaml

        h = self.held_out()
        doc = {"calibration": {"source": self.source, "prefill": round(self.fit.prefill, 6),
                               "decode": round(self.fit.decode, 6), "overhead_ms": round(self.fit.overhead_ms, 6),
                               "fitted_on": f"{measured}: {self.fit.rows} rows, {len(self.groups)} (GPU, engine, model) groups",
                               "leave_one_group_out": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in h.items()}}}
        return "# Written by `optimize calibrate`; apply with performance.calibration: <this file>.\n" + \
            yaml.safe_dump(doc, sort_keys=False)


def _med(t, p) -> dict:
    return {"ttft_median_abs_error": float(np.median(t)) if t else None,
            "tpot_median_abs_error": float(np.median(p)) if p else None}


@dataclass
class _Case:
    row: Row
    problem: object
    ttft: np.ndarray  # [P, D, N, R] of the mean TTFT (s)
    tpot: np.ndarray


def _estimate(p, cal: Optional[Calibration]):
    from optimizer.serving.estimate import estimate

    if cal is not None:
        p = replace(p, pools=tuple(replace(pl, steps=CalibratedSteps(pl.steps, cal)) for pl in p.pools))
    return estimate(p)[0].sim


def _cases(rows: list[Row], source: str, path: Path) -> tuple[list[_Case], dict]:
    from optimizer.errors import take_warnings
    from optimizer.serving import load_problem

    mapping = _mapping()
    out, skipped = [], {}
    for row in rows:
        raw, why = instance_of(row, source, mapping)
        if raw is None:
            skipped[row.id] = why
            continue
        try:
            p = load_problem(raw, path)
            if source == "measured" and p.pools[0].steps.name != "measured":
                raise InputError(path, "", p.pools[0].steps.why)
            sim = _estimate(p, None)
        except InputError as exc:
            skipped[row.id] = exc.problem
            continue
        finally:
            take_warnings()
        if not sim.linear:
            skipped[row.id] = "not every request finished in the simulation"
            continue
        row.predicted[source] = {"ttft_ms": sim.ttft_s["mean"] * 1e3, "tpot_ms": sim.tpot_s["mean"] * 1e3}
        out.append(_Case(row, p, np.array(sim.linear["ttft_s"]), np.array(sim.linear["tpot_s"])))
    return out, skipped


def _linear(c: _Case, x) -> tuple[float, float]:
    k = np.array([x[0], x[1], x[2] * 1e-3, 1.0])
    return max(float(c.ttft @ k), 1e-9), max(float(c.tpot @ k), 1e-9)


def fit(cases: list[_Case]) -> Fitted:
    """Least squares on the log ratios of the linearised TTFT and TPOT (module docstring)."""
    from scipy.optimize import least_squares

    def res(x):
        out = []
        for c in cases:
            t, p = _linear(c, x)
            out += [math.log(t * 1e3 / c.row.measured["ttft_ms"]), math.log(p * 1e3 / c.row.measured["tpot_ms"])]
        return np.array(out)

    r = least_squares(res, np.array([1.0, 1.0, 0.0]), bounds=BOUNDS)
    return Fitted(float(r.x[0]), float(r.x[1]), float(r.x[2]), len(cases))


def calibrate(rows: list[Row], source: str, path: Path) -> RunCalibration:
    """Fit on every row, and the leave-one-group-out error (module docstring).

    Raises:
        InputError: fewer than two groups with predicted rows (nothing to hold out).
    """
    cases, skipped = _cases(rows, source, path)
    groups = sorted({c.row.group[:3] for c in cases})
    if len(groups) < 2:
        raise InputError(path, "", f"{len(cases)} predicted row(s) in {len(groups)} (GPU, engine, model) group(s): "
                                   f"leave-one-group-out needs two groups or more")
    out = RunCalibration(source, rows, fit(cases), skipped=skipped)
    for g in groups:
        mine = [c for c in cases if c.row.group[:3] == g]
        f = fit([c for c in cases if c.row.group[:3] != g])
        cal = f.calibration(source)
        ht, hp, ut, up = [], [], [], []
        for c in mine:
            m = c.row.measured
            pr = c.row.predicted[source]
            ut.append(abs(pr["ttft_ms"] / m["ttft_ms"] - 1))
            up.append(abs(pr["tpot_ms"] / m["tpot_ms"] - 1))
            sim = _estimate(c.problem, cal)
            ht.append(abs(sim.ttft_s["mean"] * 1e3 / m["ttft_ms"] - 1))
            hp.append(abs(sim.tpot_s["mean"] * 1e3 / m["tpot_ms"] - 1))
        out.groups.append({"system": g[0], "engine": g[1], "model": g[2], "rows": len(mine),
                           "factors_from_others": {"prefill": f.prefill, "decode": f.decode, "overhead_ms": f.overhead_ms},
                           "uncalibrated_ttft": ut, "uncalibrated_tpot": up, "held_out_ttft": ht, "held_out_tpot": hp})
    return out


def render(cal: RunCalibration, console) -> None:
    from rich.table import Table

    f = cal.fit
    console.print(f"calibrated on the {cal.source} source: prefill x{f.prefill:.3f}, decode x{f.decode:.3f}, "
                  f"+{f.overhead_ms:.3f} ms per step ({f.rows} rows)")
    t = Table(title="Median |predicted / measured - 1|: uncalibrated vs held out (factors fitted on the other groups)")
    for c in ("GPU", "engine", "model", "rows", "TTFT uncal. | held out", "TPOT uncal. | held out"):
        t.add_column(c)
    d = cal.to_dict()
    for g in d["groups"]:
        u, h = g["uncalibrated"], g["held_out"]
        t.add_row(g["system"], g["engine"], g["model"], str(g["rows"]),
                  f"{u['ttft_median_abs_error']:.0%} | {h['ttft_median_abs_error']:.0%}",
                  f"{u['tpot_median_abs_error']:.0%} | {h['tpot_median_abs_error']:.0%}")
    console.print(t)
    u, h = d["uncalibrated"], d["leave_one_group_out"]
    console.print(f"all rows: TTFT {u['ttft_median_abs_error']:.0%} -> {h['ttft_median_abs_error']:.0%} held out, "
                  f"TPOT {u['tpot_median_abs_error']:.0%} -> {h['tpot_median_abs_error']:.0%} held out")
    if cal.skipped:
        console.print(f"not used: {len(cal.skipped)} rows (e.g. {next(iter(cal.skipped.items()))[1]})")
