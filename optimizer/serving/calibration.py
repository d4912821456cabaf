"""``optimize calibrate RESULTS...``: per (GPU, engine) factors fitted to measured serving runs, with
a prior at 1, the shrinkage strength chosen by cross-validation, and the nested leave-one-out error
that says how well they carry to a configuration not fitted on.

Rows come from aiconfigurator-core's ``silicon_sample.csv`` layout or from the benchmark clients'
own result files (:mod:`optimizer.serving.benchresults`), and each is simulated once by the same
closed-loop estimate as ``optimize fidelity``. The simulator splits every request's TTFT and TPOT
into the prefill and decode parts of the steps inside it, their count and the rest
(:attr:`optimizer.serving.simulate.SimResult.linear`), so at factors ``(k_prefill, k_decode,
overhead)`` a row's mean TTFT and TPOT are, to first order, ``k_prefill·P + k_decode·D +
overhead·N + R`` (:class:`optimizer.model.steptimes.Calibration`).

Fit (:func:`fit`, per (GPU, engine)): ``scipy.optimize.least_squares`` on the mean squared
``log(predicted / measured)`` of TTFT and TPOT plus ``lambda·(log² k_prefill + log² k_decode +
(overhead / 1 ms)²)`` (a Gaussian prior at factors 1 and no overhead; ridge regression on the
log-factors), factors bounded to [0.05, 20] and the overhead to [0, 50] ms. ``lambda`` is chosen
from :data:`LAMBDAS` (``inf`` = no fit) by leaving one unit out (a model on its GPU and engine, by
default) and predicting it with its group's factors from the others (:func:`choose_lambda`).
The reported held-out error is nested: a unit's strength is chosen without it, and its rows are
simulated afresh (not linearised) with the factors fitted without it. A group whose held-out
error is worse than no fit on any unit, or that has no second unit to hold out, is refused: its
factors are written as 1, 1, 0 with the reason.
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
LAMBDAS = (0.0, 0.01, 0.1, 1.0, 10.0, math.inf)  # shrinkage strengths tried; inf: no fit (the prior)
OVERHEAD_SCALE_MS = 1.0  # the overhead's prior scale: 1 ms costs as much as a factor of e
HOLD_OUT = ("model", "workload", "run")


@dataclass
class Fitted:
    prefill: float
    decode: float
    overhead_ms: float
    rows: int

    def calibration(self, base: str, file: str = "") -> Calibration:
        return Calibration(self.prefill, self.decode, self.overhead_ms * 1e-3, base, file)

    def as_dict(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode, "overhead_ms": self.overhead_ms}


@dataclass
class RunCalibration:
    source: str
    rows: list
    fit: Fitted  # the top-level factors: the prior (a GPU and engine not under groups is not calibrated)
    groups: list = field(default_factory=list)  # per leave-out unit: rows, uncalibrated and held-out errors
    skipped: dict = field(default_factory=dict)
    lam: float = math.inf
    scores: dict = field(default_factory=dict)  # lambda -> cross-validation score (None: nothing to score)
    hold_out: str = "model"
    factor_groups: list = field(default_factory=list)  # per (GPU, engine): fit (written), fitted, note, models

    def _pooled(self, kind: str) -> dict:
        t = [e for g in self.groups for e in g[f"{kind}_ttft"]]
        return {"rows": len(t), **_med(t, [e for g in self.groups for e in g[f"{kind}_tpot"]])}

    def held_out(self) -> dict:
        """Median absolute held-out TTFT / TPOT error over every row predicted by a fit without its unit."""
        return self._pooled("held_out")

    def uncalibrated(self) -> dict:
        """The same over the uncalibrated predictions."""
        return self._pooled("uncalibrated")

    def written(self) -> dict:
        """The same with the factors as written (a refused group's rows at their uncalibrated error)."""
        refused = {(fg["system"], fg["engine"]) for fg in self.factor_groups if fg["note"]}
        t, p = [], []
        for g in self.groups:
            kind = "uncalibrated" if (g["system"], g["engine"]) in refused else "held_out"
            t += g[f"{kind}_ttft"]
            p += g[f"{kind}_tpot"]
        return {"rows": len(t), **_med(t, p)}

    def models(self) -> list[str]:
        return sorted({m for fg in self.factor_groups for m in fg["models"]})

    def to_dict(self) -> dict:
        return {"problem": "calibrate-serving", "source": self.source, "factors": self.fit.as_dict(),
                "lambda": None if math.isinf(self.lam) else self.lam, "hold_out": self.hold_out,
                "cv_scores": {("inf" if math.isinf(k) else str(k)): v for k, v in self.scores.items()},
                "models": self.models(),
                "factor_groups": [{"system": fg["system"], "engine": fg["engine"], "models": fg["models"],
                                   "rows": fg["rows"], "factors": fg["fit"].as_dict(),
                                   "fitted": fg["fitted"].as_dict(), "refused": fg["note"] or None}
                                  for fg in self.factor_groups],
                "fitted_rows": self.fit.rows, "uncalibrated": self.uncalibrated(), "leave_one_group_out": self.held_out(),
                "as_written": self.written(),
                "groups": [{k: v for k, v in g.items() if not k.startswith(("held_out_", "uncalibrated_"))}
                           | {"uncalibrated": _med(g["uncalibrated_ttft"], g["uncalibrated_tpot"]),
                              "held_out": _med(g["held_out_ttft"], g["held_out_tpot"])} for g in self.groups],
                "skipped": self.skipped}

    def yaml_text(self, measured: str) -> str:
        """The calibration file (``performance.calibration``): the top-level ``prefill``, ``decode``,
        ``overhead_ms`` are the prior (1, 1, 0: what a GPU and engine not under ``groups`` get), and
        ``groups`` holds the per (GPU, engine) factors with the models they were fitted on."""
        import yaml

        r = lambda v: round(v, 6)  # noqa: E731
        h = self.written()
        doc = {"calibration": {
            "source": self.source, "prefill": 1.0, "decode": 1.0, "overhead_ms": 0.0,
            "models": self.models(),
            "fitted_on": f"{measured}: {self.fit.rows} rows, {len(self.factor_groups)} (GPU, engine) groups, "
                         f"lambda {'inf (no fit)' if math.isinf(self.lam) else self.lam}, held out by {self.hold_out}",
            "leave_one_group_out": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in h.items()},
            "groups": [{"gpu_system": fg["system"], "engine": fg["engine"], "models": fg["models"],
                        "prefill": r(fg["fit"].prefill), "decode": r(fg["fit"].decode),
                        "overhead_ms": r(fg["fit"].overhead_ms), "rows": fg["rows"],
                        **({"note": fg["note"]} if fg["note"] else {})} for fg in self.factor_groups]}}
        return ("# Written by `optimize calibrate`; apply with performance.calibration: <this file>.\n"
                "# Top-level factors: the prior (a GPU and engine not under groups: is not calibrated).\n"
                + yaml.safe_dump(doc, sort_keys=False))


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
    """Linearised mean TTFT and TPOT (s) of a case at factors ``x = (k_prefill, k_decode, overhead_ms)``."""
    k = np.array([x[0], x[1], x[2] * 1e-3, 1.0])
    return max(float(c.ttft @ k), 1e-9), max(float(c.tpot @ k), 1e-9)


def factor_key(row: Row) -> tuple:
    """The (GPU system, engine) a row's factors belong to."""
    return row.group[:2]


def cv_key(row: Row, hold_out: str) -> tuple:
    """The leave-out unit of a row: ``model`` (GPU, engine, model), ``workload`` (also ISL, OSL)
    or ``run`` (the row itself)."""
    g = row.group[:3]
    if hold_out == "model":
        return g
    if hold_out == "workload":
        return (*g, row.fields["isl"], row.fields["osl"])
    return (*g, row.id)


PRIOR = (1.0, 1.0, 0.0)


def fit(cases: list[_Case], lam: float = 0.0) -> Fitted:
    """Factors of one (GPU, engine) group: ``scipy.optimize.least_squares`` on the residuals
    ``log(predicted / measured)`` of TTFT and TPOT over the ``n`` rows, scaled by ``1/sqrt(n)``,
    plus the prior ``sqrt(lam)·(log k_prefill, log k_decode, overhead_ms / OVERHEAD_SCALE_MS)``
    (ridge shrinkage of the log-factors towards 0, i.e. the factors towards 1 and the overhead
    towards 0; ``lam = inf`` is no fit, the prior itself). Bounds :data:`BOUNDS`."""
    from scipy.optimize import least_squares

    if not cases or math.isinf(lam):
        return Fitted(*PRIOR, len(cases))
    meas = np.array([[c.row.measured["ttft_ms"], c.row.measured["tpot_ms"]] for c in cases]) * 1e-3
    A = np.array([c.ttft for c in cases])  # [n, 4]
    B = np.array([c.tpot for c in cases])
    n = len(cases)

    def res(z):
        k = np.array([math.exp(z[0]), math.exp(z[1]), z[2] * 1e-3, 1.0])
        t = np.maximum(A @ k, 1e-9)
        p = np.maximum(B @ k, 1e-9)
        data = np.concatenate([np.log(t / meas[:, 0]), np.log(p / meas[:, 1])]) / math.sqrt(n)
        return np.concatenate([data, math.sqrt(lam) * np.array([z[0], z[1], z[2] / OVERHEAD_SCALE_MS])])

    lo = (math.log(BOUNDS[0][0]), math.log(BOUNDS[0][1]), BOUNDS[0][2])
    hi = (math.log(BOUNDS[1][0]), math.log(BOUNDS[1][1]), BOUNDS[1][2])
    # start inside the bounds: from the overhead's lower bound (0) trf's first step was null and the
    # fit stopped at the prior (ftol), whatever the data
    r = least_squares(res, np.array([0.0, 0.0, 1e-3]), bounds=(lo, hi))
    return Fitted(math.exp(r.x[0]), math.exp(r.x[1]), float(r.x[2]), n)


def fit_groups(cases: list[_Case], lam: float) -> dict:
    """:func:`fit` per (GPU, engine) group: ``{factor_key: Fitted}``."""
    keys = sorted({factor_key(c.row) for c in cases})
    return {k: fit([c for c in cases if factor_key(c.row) == k], lam) for k in keys}


def _errors(cases: list[_Case], f: Fitted) -> tuple[list, list]:
    x = (f.prefill, f.decode, f.overhead_ms)
    t, p = [], []
    for c in cases:
        tt, pp = _linear(c, x)
        t.append(abs(tt * 1e3 / c.row.measured["ttft_ms"] - 1))
        p.append(abs(pp * 1e3 / c.row.measured["tpot_ms"] - 1))
    return t, p


def cv_score(cases: list[_Case], lam: float, hold_out: str) -> Optional[float]:
    """Mean over the leave-out units whose (GPU, engine) has other rows of (median |TTFT error| +
    median |TPOT error|), each unit predicted (linearised) by its group's factors fitted at ``lam``
    on the other units; None when no unit has such rows (nothing to score)."""
    units = sorted({cv_key(c.row, hold_out) for c in cases})
    scores = []
    for u in units:
        mine = [c for c in cases if cv_key(c.row, hold_out) == u]
        k = factor_key(mine[0].row)
        train = [c for c in cases if cv_key(c.row, hold_out) != u and factor_key(c.row) == k]
        if not train:
            continue
        t, p = _errors(mine, fit(train, lam))
        scores.append(float(np.median(t) + np.median(p)))
    return float(np.mean(scores)) if scores else None


def choose_lambda(cases: list[_Case], hold_out: str) -> tuple[float, dict]:
    """The shrinkage strength of :data:`LAMBDAS` with the lowest :func:`cv_score` (``inf``, no fit,
    when nothing can be scored or on ties: the smallest change wins), and every score."""
    scores = {lam: cv_score(cases, lam, hold_out) for lam in LAMBDAS}
    if scores[math.inf] is None:
        return math.inf, scores
    best = math.inf
    for lam in sorted(LAMBDAS, reverse=True):  # from no fit down: a weaker prior must beat it strictly
        if scores[lam] < scores[best] - 1e-12:
            best = lam
    return best, scores


def calibrate(rows: list[Row], source: str, path: Path, hold_out: str = "model") -> RunCalibration:
    """Per (GPU, engine) factors with shrinkage chosen by cross-validation, their nested
    leave-one-unit-out error, and the refusal of groups whose held-out error is worse than no fit.

    1. Every row is simulated once uncalibrated (its linearisation, :func:`_cases`).
    2. Held-out error (nested): for each leave-out unit ``u`` (:func:`cv_key`), the strength is chosen
       by :func:`choose_lambda` on the other units only, its group's factors are fitted on them, and
       the unit's rows are simulated afresh with those factors (the uncalibrated figures when the
       choice is no fit or its (GPU, engine) has no other rows).
    3. The written factors: strength chosen on every row, :func:`fit_groups`; a group is refused
       (factors 1, 1, 0 with the reason) when any of its units' held-out median TTFT or TPOT error is
       above the uncalibrated one, or when none of its units had another to be fitted on.

    Raises:
        InputError: no row could be simulated.
    """
    cases, skipped = _cases(rows, source, path)
    if not cases:
        raise InputError(path, "", "no row could be predicted: " + (next(iter(skipped.values())) if skipped else "no rows"))
    units = sorted({cv_key(c.row, hold_out) for c in cases})
    lam, scores = choose_lambda(cases, hold_out)
    out = RunCalibration(source, rows, Fitted(*PRIOR, len(cases)), skipped=skipped, lam=lam, scores=scores,
                         hold_out=hold_out)
    fitted = fit_groups(cases, lam)
    for u in units:
        mine = [c for c in cases if cv_key(c.row, hold_out) == u]
        k = factor_key(mine[0].row)
        others = [c for c in cases if cv_key(c.row, hold_out) != u]
        train = [c for c in others if factor_key(c.row) == k]
        lam_u = choose_lambda(others, hold_out)[0] if train else math.inf
        f = fit(train, lam_u) if train else Fitted(*PRIOR, 0)
        cal = None if (f.prefill, f.decode, f.overhead_ms) == PRIOR else f.calibration(source)
        ht, hp, ut, up = [], [], [], []
        for c in mine:
            m = c.row.measured
            pr = c.row.predicted[source]
            ut.append(abs(pr["ttft_ms"] / m["ttft_ms"] - 1))
            up.append(abs(pr["tpot_ms"] / m["tpot_ms"] - 1))
            if cal is None:
                ht.append(ut[-1])
                hp.append(up[-1])
                continue
            sim = _estimate(c.problem, cal)
            ht.append(abs(sim.ttft_s["mean"] * 1e3 / m["ttft_ms"] - 1))
            hp.append(abs(sim.tpot_s["mean"] * 1e3 / m["tpot_ms"] - 1))
        out.groups.append({"system": k[0], "engine": k[1], "model": mine[0].row.group[2], "unit": list(map(str, u)),
                           "rows": len(mine), "fitted_on_rows": len(train),
                           "lambda_from_others": _lam_out(lam_u),
                           "factors_from_others": {"prefill": f.prefill, "decode": f.decode, "overhead_ms": f.overhead_ms},
                           "uncalibrated_ttft": ut, "uncalibrated_tpot": up, "held_out_ttft": ht, "held_out_tpot": hp})
    for k, f in fitted.items():
        mine = [g for g in out.groups if (g["system"], g["engine"]) == k]
        note = ""
        if math.isinf(lam):
            note = "no fit: cross-validation chose the prior (no fit held out better)"
        elif not any(g["fitted_on_rows"] for g in mine):
            note = f"refused: no other {hold_out} on this GPU and engine to hold out, so the fit is not validated"
        else:
            worse = [g for g in mine if np.median(g["held_out_ttft"]) > np.median(g["uncalibrated_ttft"]) + 1e-12
                     or np.median(g["held_out_tpot"]) > np.median(g["uncalibrated_tpot"]) + 1e-12]
            if worse:
                g = worse[0]
                note = (f"refused: held out worse than no fit on {g['model']} (TTFT "
                        f"{np.median(g['uncalibrated_ttft']):.1%} -> {np.median(g['held_out_ttft']):.1%}, TPOT "
                        f"{np.median(g['uncalibrated_tpot']):.1%} -> {np.median(g['held_out_tpot']):.1%})")
        final = Fitted(*PRIOR, f.rows) if note else f
        out.factor_groups.append({"system": k[0], "engine": k[1], "fit": final, "fitted": f, "note": note,
                                  "models": sorted({c.row.group[2] for c in cases if factor_key(c.row) == k}),
                                  "rows": f.rows})
    return out


def _lam_out(lam: float):
    return None if math.isinf(lam) else lam


def render(cal: RunCalibration, console) -> None:
    from rich.table import Table

    lam = "inf (no fit)" if math.isinf(cal.lam) else f"{cal.lam:g}"
    console.print(f"calibrated on the {cal.source} source, per (GPU, engine); shrinkage lambda {lam} "
                  f"(cross-validated, held out by {cal.hold_out})")
    for fg in cal.factor_groups:
        f = fg["fit"]
        console.print(f"  {fg['system']} {fg['engine']}: prefill x{f.prefill:.3f}, decode x{f.decode:.3f}, "
                      f"+{f.overhead_ms:.3f} ms per step ({fg['rows']} rows)" + (f"; {fg['note']}" if fg["note"] else ""))
    t = Table(title="Median |predicted / measured - 1|: uncalibrated vs held out (factors fitted without the unit)")
    for c in ("GPU", "engine", "model", "unit", "rows", "TTFT uncal. | held out", "TPOT uncal. | held out"):
        t.add_column(c)
    d = cal.to_dict()
    for g in d["groups"]:
        u, h = g["uncalibrated"], g["held_out"]
        t.add_row(g["system"], g["engine"], g["model"], " ".join(g["unit"][3:]) or "-", str(g["rows"]),
                  f"{u['ttft_median_abs_error']:.0%} | {h['ttft_median_abs_error']:.0%}",
                  f"{u['tpot_median_abs_error']:.0%} | {h['tpot_median_abs_error']:.0%}")
    console.print(t)
    u, h, w = d["uncalibrated"], d["leave_one_group_out"], d["as_written"]
    console.print(f"all rows: TTFT {u['ttft_median_abs_error']:.0%} -> {h['ttft_median_abs_error']:.0%} held out "
                  f"({w['ttft_median_abs_error']:.0%} as written), TPOT {u['tpot_median_abs_error']:.0%} -> "
                  f"{h['tpot_median_abs_error']:.0%} held out ({w['tpot_median_abs_error']:.0%} as written)")
    if cal.skipped:
        console.print(f"not used: {len(cal.skipped)} rows (e.g. {next(iter(cal.skipped.items()))[1]})")
