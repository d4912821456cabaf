"""Parallel layouts: attention TP x DP, experts TP x EP, pipeline stages, context and sequence parallelism.

A layout of one model instance is ``attention: {tp, dp}``, ``experts: {tp, ep}`` (MoE only),
``pp``, ``cp`` and ``sp``, with ``attention.tp x attention.dp = experts.tp x experts.ep = GPUs
per CP rank``, ``cp x GPUs per CP rank = GPUs per stage`` and ``pp x GPUs per stage = GPUs of
the instance``. A dense model has no experts section: its FFN follows the attention TP (and
attention DP replicates it).

* ``cp`` (context parallelism, reference chapter 6.2.4): the prompt's tokens are split over
  ``cp`` ranks, each a whole TP x DP group holding the same TP-split weights; attention needs the
  K/V of the other ranks (ring exchange or all-gather, :mod:`optimizer.model.sequence`). 1 (the
  default) is no CP: every existing figure is unchanged.
* ``sp`` (Megatron sequence parallelism, chapter 6.2.3; Korthikanti et al. 2022): inside the TP
  group the LayerNorm/dropout/residual activations are split along the sequence and each
  AllReduce becomes a ReduceScatter + AllGather. False (the default) is no SP.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from optimizer.errors import InputError
from optimizer.model.config import ModelSpec


@dataclass(frozen=True)
class Layout:
    """Parallel degrees of one model instance.

    Attributes:
        attention_tp: GPUs splitting each attention (and dense FFN, shared expert, embedding, LM head).
        attention_dp: attention replicas, each serving its own sessions (DP attention).
        experts_tp: GPUs splitting each routed expert.
        experts_ep: groups the routed experts are divided over (EP).
        pp: pipeline stages, each holding a contiguous block of layers.
        cp: context-parallel ranks a prompt's tokens are split over (each rank a TP x DP group).
        sp: Megatron sequence parallelism inside the attention-TP group (needs ``attention_tp > 1``).
    """

    attention_tp: int = 1
    attention_dp: int = 1
    experts_tp: int = 1
    experts_ep: int = 1
    pp: int = 1
    cp: int = 1
    sp: bool = False

    @classmethod
    def tp(cls, p: int) -> "Layout":
        """Plain tensor parallelism over ``p`` GPUs (attention and experts split ``p`` ways)."""
        return cls(attention_tp=p, experts_tp=p)

    @property
    def gpus_per_cp_rank(self) -> int:
        """GPUs of one context-parallel rank: ``attention.tp x attention.dp``."""
        return self.attention_tp * self.attention_dp

    @property
    def gpus_per_stage(self) -> int:
        """GPUs of one pipeline stage: ``cp x attention.tp x attention.dp``."""
        return self.gpus_per_cp_rank * self.cp

    @property
    def gpus(self) -> int:
        return self.gpus_per_stage * self.pp

    def label(self) -> str:
        """Short name, e.g. ``TP8``, ``TP2xDP4/EP4xTP2``, ``TP4 PP2``, ``TP2xCP4``, ``TP8 SP``."""
        a = f"TP{self.attention_tp}" + (f"xDP{self.attention_dp}" if self.attention_dp > 1 else "") \
            + (f"xCP{self.cp}" if self.cp > 1 else "")
        e = "" if (self.experts_ep == 1 and self.experts_tp == self.attention_tp) else \
            f"/EP{self.experts_ep}" + (f"xTP{self.experts_tp}" if self.experts_tp > 1 else "")
        return a + e + (" SP" if self.sp else "") + (f" PP{self.pp}" if self.pp > 1 else "")

    def as_dict(self) -> dict:
        """``{attention: {tp, dp}, experts: {tp, ep}, pp}`` plus ``cp`` / ``sp`` only when set (so
        every existing dict, and the measured tables' cache keys built from it, are unchanged)."""
        d = {"attention": {"tp": self.attention_tp, "dp": self.attention_dp},
             "experts": {"tp": self.experts_tp, "ep": self.experts_ep}, "pp": self.pp}
        if self.cp != 1:
            d["cp"] = self.cp
        if self.sp:
            d["sp"] = True
        return d


def layout_problem(m: ModelSpec, lay: Layout, gpus: Optional[int] = None) -> Optional[tuple[str, str]]:
    """None if ``lay`` fits model ``m`` (and ``gpus`` GPUs when given), else (field, problem).

    Rules: every degree positive; attention TP divides the query heads and divides the KV heads
    or is a multiple of them (as vLLM and SGLang require); it divides the linear-attention key
    and value heads of hybrid models; ``attention.tp x attention.dp = experts.tp x experts.ep``;
    EP divides the routed experts; a dense model has ``experts.ep = 1`` and ``experts.tp =
    attention.tp`` (its FFN follows attention); PP <= layers; ``pp x GPUs per stage = gpus``;
    ``cp`` a positive integer; ``sp`` a bool and only with ``attention.tp > 1`` (it splits the TP
    group's activations).
    """
    for name, v in (("attention.tp", lay.attention_tp), ("attention.dp", lay.attention_dp),
                    ("experts.tp", lay.experts_tp), ("experts.ep", lay.experts_ep), ("pp", lay.pp),
                    ("cp", lay.cp)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            return name, f"must be a positive integer (got {v!r})"
    if not isinstance(lay.sp, bool):
        return "sp", f"must be true or false (got {lay.sp!r})"
    if lay.sp and lay.attention_tp == 1:
        return "sp", "sequence parallelism splits the TP group's activations: it needs attention.tp > 1"
    p = lay.attention_tp
    if m.q_heads % p or (m.kv_heads % p and p % m.kv_heads):
        return "attention.tp", f"TP{p} does not split {m.q_heads} attention heads and {m.kv_heads} KV heads evenly"
    if m.linear and (m.linear.k_heads % p or m.linear.v_heads % p):
        return "attention.tp", (f"TP{p} does not split the linear-attention heads "
                                f"({m.linear.k_heads} key, {m.linear.v_heads} value) evenly")
    if m.moe is None:
        if lay.experts_ep != 1 or lay.experts_tp != lay.attention_tp:
            return "experts", "a dense model has no experts: experts.ep must be 1 and experts.tp equal attention.tp"
    else:
        if lay.experts_tp * lay.experts_ep != lay.gpus_per_cp_rank:
            return "experts", (f"experts.tp x experts.ep = {lay.experts_tp} x {lay.experts_ep} must equal "
                               f"attention.tp x attention.dp = {lay.attention_tp} x {lay.attention_dp}")
        if m.moe.experts % lay.experts_ep:
            return "experts.ep", f"EP{lay.experts_ep} does not divide the {m.moe.experts} routed experts"
    if lay.pp > m.layers:
        return "pp", f"{lay.pp} stages is more than the {m.layers} layers"
    if gpus is not None and lay.gpus != gpus:
        cp = f" x {lay.cp}" if lay.cp > 1 else ""
        return "gpus", (f"pp x attention.tp x attention.dp{' x cp' if cp else ''} = {lay.pp} x {lay.attention_tp} x "
                        f"{lay.attention_dp}{cp} = {lay.gpus} GPUs, not the {gpus} GPUs of the instance")
    return None


def check_layout(m: ModelSpec, lay: Layout, gpus: Optional[int] = None, file: str | Path | None = None,
                 prefix: str = "layout") -> Layout:
    """Return ``lay`` if valid (see :func:`layout_problem`).

    Raises:
        InputError: naming ``<prefix>.<field>`` and the problem.
    """
    bad = layout_problem(m, lay, gpus)
    if bad:
        raise InputError(file, f"{prefix}.{bad[0]}", bad[1])
    return lay


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def span_problem(lay: Layout, gpus_per_server: int) -> Optional[tuple[str, str]]:
    """Why a worker of layout ``lay`` cannot run on servers of ``gpus_per_server`` GPUs, or None.

    A worker may span servers (wide EP, DeepSeek / SGLang style): its attention-DP ranks and its
    experts' EP groups spread over whole servers and talk over the scale-out NICs (All-to-All
    dispatch and combine, :meth:`optimizer.model.hardware.Hardware.alltoall_s`), while every TP
    group (attention TP, experts TP) stays inside one server's scale-up domain, as the engines
    place them. Returns ``(field, message)``: ``tp`` for a TP group wider than a server,
    ``gpus`` for a spanning worker that does not take whole servers."""
    s = gpus_per_server
    if lay.gpus <= s:
        return None
    if lay.attention_tp > s:
        return "tp", (f"TP{lay.attention_tp} crosses the scale-up domain ({s} GPUs per server): a worker spans "
                      f"servers through attention DP x EP, its TP groups stay inside one server")
    if lay.experts_tp > s:
        return "tp", (f"experts TP{lay.experts_tp} crosses the scale-up domain ({s} GPUs per server): spread the "
                      f"experts with EP across servers instead")
    if lay.gpus % s:
        return "gpus", (f"{lay.label()} needs {lay.gpus} GPUs: a worker that spans servers takes whole servers "
                        f"(a multiple of {s})")
    return None


def spanning_layouts(m: ModelSpec, gpus_per_server: int, max_gpus: int) -> list[Layout]:
    """Wide-EP layouts of MoE model ``m`` over 2 or more whole servers, up to ``max_gpus`` GPUs:
    attention TP ``t`` (a divisor of the server's GPUs) x attention DP ``g / t``, the routed experts
    over all ``g`` GPUs (experts TP 1, EP ``g``), for every ``g = k * gpus_per_server``; only the
    ones :func:`layout_problem` and :func:`span_problem` accept. Empty for a dense model."""
    if m.moe is None:
        return []
    out = []
    s = gpus_per_server
    for g in range(2 * s, max_gpus + 1, s):
        for atp in _divisors(s):
            lay = Layout(atp, g // atp, 1, g, 1)
            if layout_problem(m, lay) is None and span_problem(lay, s) is None:
                out.append(lay)
    return out


def enumerate_layouts(m: ModelSpec, max_gpus: int) -> Iterator[Layout]:
    """Every valid layout of ``m`` on 1..``max_gpus`` GPUs, ordered by GPUs, then pp, attention
    TP, experts EP. Dense models get ``experts.tp = attention.tp`` and ``experts.ep = 1``."""
    for n in range(1, max_gpus + 1):
        for pp in _divisors(n):
            g = n // pp
            for atp in _divisors(g):
                adp = g // atp
                if m.moe is None:
                    cands = [Layout(atp, adp, atp, 1, pp)]
                else:
                    cands = [Layout(atp, adp, g // ep, ep, pp) for ep in _divisors(g)]
                for lay in cands:
                    if layout_problem(m, lay) is None:
                        yield lay


def default_layouts(m: ModelSpec, max_gpus: int, gpus_per_server: int) -> list[Layout]:
    """The canonical layouts tried when an instance lists none (a few per GPU count).

    GPU counts are the powers of two up to ``max_gpus`` (they divide a server of a power-of-two
    size, or are whole multiples of it, so instances pack onto servers exactly).

    * dense model: TP over ``g`` GPUs (as the TP-only shorthand always did); PP and DP
      layouts of a dense model are used only when listed in ``deployment.layouts``;
    * MoE model, ``g`` within one server: TP``g`` (experts split ``g`` ways) and, for every
      power of two ``e`` with ``1 < e <= g`` dividing the routed experts, attention TP ``g/e``
      x DP ``e`` with experts TP ``g/e`` x EP ``e`` (TP2xEP4, and DP attention + EP when
      ``e = g``);
    * MoE model, ``g`` over several servers: the same TP / TP x EP family over all ``g`` GPUs
      (EP All-to-All over the scale-out network), and PP over servers (``g / server`` stages,
      each one server laid out as above).

    Only layouts valid for ``m`` (:func:`layout_problem`) are returned, ordered by GPUs.
    """
    out: list[Layout] = []
    sizes = [2 ** i for i in range(64) if 2 ** i <= max_gpus]
    for g in sizes:
        if m.moe is None:
            cands = [Layout.tp(g)]
        else:
            def family(n: int) -> list[Layout]:
                fam = [Layout.tp(n)]
                e = 2
                while e <= n:
                    fam.append(Layout(n // e, e, n // e, e, 1))
                    e *= 2
                return fam
            cands = family(g)  # over several servers EP's All-to-All crosses the scale-out network
            if g > gpus_per_server and g % gpus_per_server == 0:
                cands += [Layout(s.attention_tp, s.attention_dp, s.experts_tp, s.experts_ep, g // gpus_per_server)
                          for s in family(gpus_per_server)]
        out += [lay for lay in cands if layout_problem(m, lay) is None and lay not in out]
    return out
