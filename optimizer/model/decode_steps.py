"""Decode steps of continuing sessions from a step-time source, with the lower bounds a solver
needs: the deployment problem's view of :mod:`optimizer.model.steptimes`.

The deployment problem decodes sessions whose KV cache already holds their context; every
figure it reads about time comes from one object of this module (``PerfModel.steps`` of
:mod:`optimizer.deployment.perf`), so the formulations, bounds, heuristics and the evaluator are
timed by the same source:

* :meth:`DecodeSteps.single_session_step_s` - one session alone at each of its positions;
* :meth:`DecodeSteps.batch_steps_s` - ``steps`` consecutive batched decode steps of an active
  set (every session advances one token per step);
* :meth:`DecodeSteps.decode_step_floor` - ``step(A) >= g[|A|] + kv_rate * sum_i (s_i + 1) / dp``
  for every active set of at most ``b_max`` sessions at positions below ``max_positions``
  (:class:`optimizer.model.perf.StepFloor`), from which the bound LP's fixed and KV rates
  (:meth:`DecodeSteps.fixed_and_kv_rates`) and the per-session floor sigma
  (:meth:`DecodeSteps.session_step_floor`) follow;
* :meth:`DecodeSteps.token_rate` - an estimate for heuristics only.

Two sources:

* :class:`AnalyticDecode` - the chapter's roofline (eq. 6-2 with alpha-beta collectives) of
  :class:`optimizer.model.perf.PerfModel`, unchanged (every figure of the book instances);
* :class:`MeasuredDecode` - the measured tables of :class:`optimizer.model.measured.MeasuredSteps`
  (aiconfigurator-core's kernel database): a step of ``b_r`` decodes on attention-DP rank ``r``
  whose sessions read ``S_r = sum (s_i + 1)`` KV tokens is ``T[0, b_r, S_r / b_r]`` (the table's
  decode step at the rank's mean context), the step the slowest rank's; under ``auto`` a layout
  the database cannot time falls back to :class:`AnalyticDecode` (announced once).

Memory per GPU stays eq. 6-1 under both (the source times steps; the memory rows and the
evaluator's memory check are the chapter's with the instance's reserve).

Units: seconds, tokens.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel, StepFloor, _concave_floor, batch_step_table
from optimizer.model.steptimes import ANALYTIC
from optimizer.model.weights import ACTIVATION_BYTES


class DecodeSteps:
    """Common part of the decode sources: a cache for the problem's memoised timelines.

    Attributes:
        name: ``chapter``, ``analytic`` or ``measured``; why: one sentence naming the source (and database).
        memo: caches keyed by the problem (segments, exact columns), cleared with the source.
    """

    name = "analytic"
    why = ""

    def __init__(self):
        self.memo: dict = {}

    def cache(self, key: str) -> dict:
        """The named cache (a dict) of this source."""
        return self.memo.setdefault(key, {})

    def source_of(self, lay: Layout) -> str:
        """Which source times ``lay`` (``analytic`` or ``measured``)."""
        return self.name

    # ------------------------------------------------------------------ derived bounds
    def fixed_and_kv_rates(self, lay: Layout, max_positions: Optional[float] = None) -> tuple[float, float]:
        """``(w, kv)``: every step of ``lay`` with at least one session (positions ``s_i + 1 <=
        max_positions``) takes at least ``w`` seconds plus ``kv`` seconds per token position its
        sessions read (``kv`` averaged over the attention-DP ranks). From the floor: ``step(A) >=
        g[|A|] + kv_rate * S / dp >= g[1] + (kv_rate / dp) * S`` (g nondecreasing)."""
        f = self.decode_step_floor(lay, 1, max_positions)
        return float(f.g[1]), f.kv_rate / f.dp

    def session_step_floor(self, lay: Layout, w: float, b_max: int, max_positions: Optional[float] = None) -> float:
        """sigma (s): the largest rate with ``step(b) >= w + KV reads + sigma * (b - 1)`` for every
        batch size ``1 <= b <= b_max`` (dp = 1): ``min_b (g[b] - w) / (b - 1)`` of the floor; 0 for
        attention DP or ``b_max < 2``."""
        if lay.attention_dp != 1 or b_max < 2:
            return 0.0
        f = self.decode_step_floor(lay, b_max, max_positions)
        b = np.arange(2, int(b_max) + 1)
        return max(0.0, float(np.min((f.g[b] - w) / (b - 1.0))))


class AnalyticDecode(DecodeSteps):
    """The chapter's roofline through :class:`optimizer.model.perf.PerfModel` (eq. 6-2, the
    alpha-beta or nccl-tests collectives, PP hand-offs, two micro-batches)."""

    name = "chapter"

    def __init__(self, model: PerfModel, why: str = "the reference chapter's roofline (eq. 6-2) at the catalog's "
                                                     "datasheet peaks", name: str = "chapter"):
        super().__init__()
        self.model = model
        self.why = why
        self.name = name

    def single_session_step_s(self, lay: Layout, positions) -> np.ndarray:
        """Step time (s) of one session alone at each position (shape [n] -> [n])."""
        return self.model.single_session_step_s(lay, positions)

    def batch_steps_s(self, lay: Layout, positions, steps: int, rank=None) -> np.ndarray:
        """Times (s) of ``steps`` batched decode steps of the sessions at ``positions`` (shape
        [n]) on DP ``rank`` (shape [n], default round robin); shape [steps]."""
        return batch_step_table(self.model).step_times_s(lay, positions, steps, rank=rank)

    def decode_step_floor(self, lay: Layout, b_max: int, max_positions: Optional[float] = None) -> Optional[StepFloor]:
        """:meth:`optimizer.model.perf.PerfModel.decode_step_floor` (valid at every context)."""
        return self.model.decode_step_floor(lay, b_max)

    def fixed_and_kv_rates(self, lay: Layout, max_positions: Optional[float] = None) -> tuple[float, float]:
        """The roofline's own split (at every context) (valid under two micro-batches too): per stage the HBM time of
        the weights plus the collectives of one token, and the HBM time of one KV position.

        Under two micro-batches a step of two or more sessions may hide its collectives, but each
        half reads the weights (``sum_h max(local_h, compute_h) >= 2 w_l0 + KV reads``), so the
        fixed part is ``l0 + min(l0, collectives of b = 1)``, valid for one-session steps too."""
        m = self.model
        dp = lay.attention_dp
        w = kv = 0.0
        zero = np.zeros(dp)
        one = np.zeros(dp)
        one[0] = 1.0
        two = m.micro_batches == 2
        for st in m.stages(lay.pp):
            l0 = float(np.max(m.stage_terms(st, lay, zero, zero, 0.0).local))
            l1 = float(np.max(m.stage_terms(st, lay, zero, one, 0.0).local)) - l0
            pieces = m.stage_terms(st, lay, one, zero, 1.0)  # one token: collectives of b = 1
            comm = float(np.max(pieces.allreduce)) + float(np.max(pieces.alltoall))
            w += l0 + (min(l0, comm) if two else comm)
            kv += max(0.0, l1) / dp
        return w, kv

    def session_step_floor(self, lay: Layout, w: float, b_max: int, max_positions: Optional[float] = None) -> float:
        """sigma of the roofline: ``min_b (Delta(b) / (b - 1))`` with ``Delta(b)`` the zero-context
        step of b tokens (HBM time at zero context, collectives and hand-offs) minus ``w``,
        evaluated at every b (the collectives' algorithm choice makes Delta piecewise linear, so
        no sample point may be skipped); 0 for attention DP, ``b_max < 2`` and two micro-batches."""
        m = self.model
        if lay.attention_dp != 1 or b_max < 2 or m.micro_batches == 2:
            return 0.0
        bs = np.arange(2, int(b_max) + 1, dtype=np.float64)
        total = np.zeros(bs.size)
        zero = np.zeros(1)
        stages = m.stages(lay.pp)
        for k, st in enumerate(stages):
            for i, b in enumerate(bs):
                pieces = m.stage_terms(st, lay, np.array([b]), zero, float(b))
                total[i] += float(pieces.local[0]) + float(np.max(pieces.allreduce)) + float(np.max(pieces.alltoall))
            if k < len(stages) - 1:
                total += np.array([m.hw.p2p_s(b * m.spec.hidden * ACTIVATION_BYTES, m.crosses_servers(lay, k))
                                   for b in bs])
        return max(0.0, float(np.min((total - w) / (bs - 1.0))))

    def token_rate(self, lay: Layout, tokens: int = 16) -> float:
        """Seconds one more decoding session adds to a step besides its KV reads (the step at
        ``tokens`` against one token at zero context): an estimate for heuristics only."""
        m = self.model
        dp = lay.attention_dp
        zero = np.zeros(dp)
        total = 0.0
        for st in m.stages(lay.pp):
            one, many = np.zeros(dp), np.zeros(dp)
            one[0], many[:] = 1.0, tokens / dp
            t1 = float(np.max(m.stage_step(st, lay, one, zero, 1.0).time))
            tn = float(np.max(m.stage_step(st, lay, many, zero, float(tokens)).time))
            total += max(0.0, tn - t1) / (tokens - 1)
        return total


class MeasuredDecode(DecodeSteps):
    """Decode steps from a measured source's tables (see the module docstring).

    Args:
        model: the shared performance model (the analytic fallback of ``auto``).
        steps: a :class:`optimizer.model.measured.MeasuredSteps` (anything with
            ``timing_table(lay)`` and ``why``).
        max_batch: the most sessions any step can hold (the floors' batch range).
        min_positions: the smallest ``s + 1`` any session is decoded at (the floors' context range).
    """

    name = "measured"

    def __init__(self, model: PerfModel, steps, max_batch: int = 1, min_positions: float = 1.0):
        super().__init__()
        self.model = model
        self.steps = steps
        self.why = steps.why
        self.max_batch = max(1, int(max_batch))
        self.min_positions = max(1.0, float(min_positions))
        fb = getattr(steps, "fallback", None)  # auto: the fitted roofline for layouts the database cannot time
        self.analytic = AnalyticDecode(fb.perf, fb.why, fb.name) if fb is not None else AnalyticDecode(model)
        self._floors: dict = {}
        self._rates: dict = {}

    def _table(self, lay: Layout):
        return self.steps.timing_table(lay)

    def source_of(self, lay: Layout) -> str:
        return "measured" if self._table(lay) is not None else self.analytic.name

    def _ms(self, tab, d, s) -> np.ndarray:
        """Decode steps (s) of ``d`` decodes per rank at mean context ``s`` (equal shapes)."""
        d = np.asarray(d, dtype=np.float64)
        s = np.asarray(s, dtype=np.float64)
        return tab.ms(np.zeros(d.size), d.reshape(-1), s.reshape(-1)).reshape(d.shape) * 1e-3

    def single_session_step_s(self, lay: Layout, positions) -> np.ndarray:
        tab = self._table(lay)
        if tab is None:
            return self.analytic.single_session_step_s(lay, positions)
        s1 = np.asarray(positions, dtype=np.float64) + 1.0
        return self._ms(tab, np.ones_like(s1), s1)

    def batch_steps_s(self, lay: Layout, positions, steps: int, rank=None) -> np.ndarray:
        tab = self._table(lay)
        if tab is None:
            return self.analytic.batch_steps_s(lay, positions, steps, rank)
        pos = np.asarray(positions, dtype=np.float64).reshape(-1)
        dp = lay.attention_dp
        rank = np.arange(pos.size) % dp if rank is None else np.asarray(rank, dtype=int)
        b_rank = np.bincount(rank, minlength=dp).astype(np.float64)
        ctx0 = np.bincount(rank, weights=pos + 1.0, minlength=dp)
        busy = b_rank > 0
        b = b_rank[busy]
        j = np.arange(steps, dtype=np.float64)[:, None]
        mean = (ctx0[busy][None, :] + j * b[None, :]) / b[None, :]  # [steps, busy ranks]
        return self._ms(tab, np.broadcast_to(b, mean.shape), mean).max(axis=1)

    def decode_step_floor(self, lay: Layout, b_max: int, max_positions: Optional[float] = None) -> Optional[StepFloor]:
        """A floor of the measured steps of ``lay``: ``step(A) >= g[|A|] + kv_rate * S / dp`` for
        every active set of at most ``b_max`` sessions whose positions ``s_i`` satisfy ``lo <= s_i
        + 1 <= max_positions`` (``S = sum (s_i + 1)``; ``lo``: the source's ``min_positions``).

        Per rank batch ``d``, the table's decode step ``f_d(x)`` at mean context ``x`` is linear in
        ``u = log x`` between the context grid's points (trilinear lookup), so ``f_d(e^u) - a -
        k d e^u`` is concave in ``u`` on each piece for ``k >= 0``: it lies above 0 on ``[lo,
        max_positions]`` iff it does at the grid points inside and the two ends. Hence ``a[d] =
        min_j f_d(x_j) - k d x_j`` over those points is exact for any ``k >= 0``; ``k`` is the
        smallest chord slope ``(f_d(hi) - f_d(lo)) / (d (hi - lo))`` over every ``d`` up to the
        source's ``max_batch``, lowered to the smallest ``f_d(x_j) / (d x_j)`` if needed so that
        every ``a[d] >= 0`` (one ``k`` per layout, shared by all its floors), and ``a`` is
        replaced by its suffix minimum (nondecreasing, still below). ``g1`` is the largest concave
        sequence below ``a`` with ``g1[0] = 0`` (:func:`optimizer.model.perf._concave_floor`):
        concave, so subadditive over the ranks, and ``max_r step_r >= (1/dp) sum_r (g1[b_r] + k
        S_r) >= (g1[b] + k S) / dp``: ``g = g1 / dp``, ``kv_rate = k``. ``max_positions`` None:
        refused (beyond the grid the lookup extrapolates, and no affine floor holds everywhere).

        Raises:
            ValueError: ``max_positions`` None, or ``b_max`` beyond the source's ``max_batch``."""
        tab = self._table(lay)
        if tab is None:
            return self.analytic.decode_step_floor(lay, b_max, max_positions)
        if max_positions is None:
            raise ValueError("a measured decode floor needs the largest position it must hold at")
        b_max = max(1, int(b_max))
        if b_max > self.max_batch:
            raise ValueError(f"a floor for {b_max} sessions asked of a source built for at most {self.max_batch}")
        top = float(max(self.min_positions, max_positions))
        key = (lay, b_max, top)
        if key not in self._floors:
            k, a = self._affine(lay, tab, top)
            g1 = _concave_floor(np.concatenate(([0.0], a[:b_max])))
            self._floors[key] = StepFloor(g1 / lay.attention_dp, k, lay.attention_dp)
        return self._floors[key]

    def _affine(self, lay: Layout, tab, top: float) -> tuple[float, np.ndarray]:
        """``(k, a[1..max_batch])`` of :meth:`decode_step_floor` over ``[min_positions, top]``."""
        from optimizer.model.measured import CONTEXT_GRID

        key = (lay, top)
        if key not in self._rates:
            lo = float(min(self.min_positions, top))
            xs = np.unique(np.concatenate(([lo, top], CONTEXT_GRID[(CONTEXT_GRID > lo) & (CONTEXT_GRID < top)])))
            d = np.arange(1, self.max_batch + 1, dtype=np.float64)
            dd, xx = np.meshgrid(d, xs, indexing="ij")  # [max_batch, points]
            f = self._ms(tab, dd, xx)
            k = 0.0 if top <= lo else float(np.min((f[:, -1] - f[:, 0]) / (d * (top - lo))))
            k = max(0.0, min(k, float(np.min(f / (dd * xx)))))  # and every a[d] >= 0
            a = np.min(f - k * dd * xx, axis=1)
            a = np.minimum.accumulate(a[::-1])[::-1]  # suffix minimum: nondecreasing in d
            self._rates[key] = (k, np.maximum(a, 0.0))  # >= 0 up to rounding
        return self._rates[key]

    def token_rate(self, lay: Layout, tokens: int = 16) -> float:
        tab = self._table(lay)
        if tab is None:
            return self.analytic.token_rate(lay, tokens)
        dp = lay.attention_dp
        t = self._ms(tab, np.array([1.0, max(1.0, tokens / dp)]), np.array([1.0, 1.0]))
        return max(0.0, float(t[1] - t[0])) / (tokens - 1)


class CalibratedDecode(DecodeSteps):
    """A decode source with a calibration's decode factor ``k`` and per-step overhead ``c``
    (:class:`optimizer.model.steptimes.Calibration`): every step ``k * t + c``. Its bounds follow
    from the base's: ``g'[b] = k g[b] + c`` for ``b >= 1`` (still concave with ``g'[0] = 0``:
    ``c >= 0``), ``kv_rate' = k kv_rate``; ``w' = k w + c``, ``kv' = k kv``, ``sigma' = k sigma``
    (a step of the slowest rank is ``k max_r t_r + c``)."""

    def __init__(self, base: DecodeSteps, decode_factor: float, overhead_s: float, why: str):
        super().__init__()
        self.base, self.k, self.c, self.why = base, float(decode_factor), float(overhead_s), why
        self.name = base.name
        self.model = base.model

    def source_of(self, lay: Layout) -> str:
        return self.base.source_of(lay)

    def single_session_step_s(self, lay, positions):
        return self.k * self.base.single_session_step_s(lay, positions) + self.c

    def batch_steps_s(self, lay, positions, steps, rank=None):
        return self.k * self.base.batch_steps_s(lay, positions, steps, rank) + self.c

    def decode_step_floor(self, lay, b_max, max_positions=None):
        f = self.base.decode_step_floor(lay, b_max, max_positions)
        if f is None:
            return None
        g = self.k * f.g + self.c
        g[0] = 0.0
        return StepFloor(g, self.k * f.kv_rate, f.dp)

    def fixed_and_kv_rates(self, lay, max_positions=None):
        w, kv = self.base.fixed_and_kv_rates(lay, max_positions)
        return self.k * w + self.c, self.k * kv

    def session_step_floor(self, lay, w, b_max, max_positions=None):
        w0 = (w - self.c) / self.k  # the base's fixed part
        return self.k * self.base.session_step_floor(lay, w0, b_max, max_positions)

    def token_rate(self, lay, tokens=16):
        return self.k * self.base.token_rate(lay, tokens)


def decode_steps(model: PerfModel, source=None, max_batch: int = 1, min_positions: float = 1.0) -> DecodeSteps:
    """The decode view of a step-time source (:func:`optimizer.model.steptimes.resolve`'s result,
    or None for the analytic roofline of ``model``; ``max_batch``: the most sessions a step can
    hold and ``min_positions`` the smallest ``s + 1`` any session is decoded at, the range of the
    measured floors); a calibrated source's decode factor and
    per-step overhead wrap the view (:class:`CalibratedDecode`).

    Raises:
        ValueError: a source this module cannot view (a speculative or otherwise wrapped source).
    """
    if source is None:
        return AnalyticDecode(model)
    base, cal = source, getattr(source, "cal", None)
    if cal is not None:
        base = source.base
    if base.name in ANALYTIC:
        view = AnalyticDecode(getattr(base, "perf", model), base.why, base.name)
    elif hasattr(base, "timing_table"):
        view = MeasuredDecode(model, base, max_batch, min_positions)
    else:
        raise ValueError(f"no decode view of the {source.name} source")
    return view if cal is None else CalibratedDecode(view, cal.decode, cal.overhead_s, source.why)
