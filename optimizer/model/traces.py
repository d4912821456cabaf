"""Routing-trace readers: every format becomes token counts ``[windows, layers, experts]``.

Shared by the expert-placement problem (``experts.trace``) and the supernode problem
(``supernode.expert_load``: the All-to-All under routing skew); :mod:`optimizer.experts.traces`
re-exports it.

Formats (``experts.format``; ``auto`` detects them):

* ``matrix`` — JSON list, CSV or ``.npy`` of token counts ``[layers, experts]`` or
  ``[windows, layers, experts]``. CSV: one row per layer, one column per expert; a blank
  line starts the next window; an optional first header row is skipped when not numeric.
* ``vllm`` — JSON ``{"load_history": [{"logical_expert_load": [[per expert] per layer]} per
  window]}`` (vLLM's EPLB load window).
* ``sglang`` — JSON with ``logical_count`` ``[layers, experts]`` or
  ``[windows, layers, experts]`` (SGLang ``--init-expert-location``), or the expert
  distribution recorder's ``.pt`` dump (a dict with ``logical_count``; needs torch).
* ``topk`` — a folder of ``expert_weights_<layer>.txt`` (DeepSeek ESFT routing records):
  one line per sequence; for each token its top-k expert ids, tab-separated, then two tabs,
  then the gate weights in the same layout. A window is one sequence, or
  ``window_tokens`` consecutive tokens (a trailing partial window is dropped).

Every problem raises :class:`~optimizer.errors.InputError` naming the file, the position
(window / layer / expert, or line / token) and the problem.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optimizer.errors import InputError

FORMATS = ("auto", "matrix", "vllm", "sglang", "topk")
_TOPK_NAME = re.compile(r"^expert_weights_(\d+)\.txt$")


@dataclass
class Trace:
    """Token counts per window, layer and expert.

    Attributes:
        loads: ``[windows, layers, experts]`` int64 token counts (tokens routed to each
            expert; a token routed top-k counts once at each of its k experts).
        file: where it came from.
        format: detected or given format.
        layer_names: label of each layer (e.g. ESFT's 1-based layer numbers).
        window_kind: what one window is ("window", "sequence", "N tokens").
        top_k: experts per token (topk traces only).
        tokens_per_window: tokens in each window (topk traces only).
    """

    loads: np.ndarray
    file: Path
    format: str
    layer_names: list[str]
    window_kind: str = "window"
    top_k: int | None = None
    tokens_per_window: list[int] = field(default_factory=list)

    @property
    def num_windows(self) -> int:
        return int(self.loads.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.loads.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.loads.shape[2])


def read_trace(path: Path, fmt: str = "auto", num_experts: int | None = None,
               window_tokens: int | None = None, top_k: int | None = None) -> Trace:
    """Read a trace in any supported format.

    Args:
        path: file, or folder for ``topk``.
        fmt: one of :data:`FORMATS`.
        num_experts: logical experts per layer; required for ``topk`` (ids are checked
            against it), checked against the shape otherwise.
        window_tokens: ``topk`` only: tokens per window (None: one window per sequence).
        top_k: ``topk`` only: experts per token (None: inferred as the greatest common
            divisor of the line lengths, checked by distinct ids within every token).
    Returns:
        A :class:`Trace` with non-negative counts, no empty window.
    Raises:
        InputError: missing file, undetectable format, wrong shape, negative counts,
            layers that disagree, expert ids out of range, empty windows.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(path, "", "trace not found")
    if fmt not in FORMATS:
        raise InputError(path, "format", f"unknown trace format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "topk":
        if not path.is_dir():
            raise InputError(path, "", "a topk trace is a folder of expert_weights_<layer>.txt files")
        trace = _read_topk(path, num_experts, window_tokens, top_k)
    else:
        if path.is_dir():
            raise InputError(path, "", f"is a folder; format {fmt} expects a file")
        if window_tokens is not None:
            raise InputError(path, "window_tokens", "only applies to topk traces")
        data = _load_file(path, fmt)
        if fmt == "vllm":
            arr = _from_vllm(data, path)
        elif fmt == "sglang":
            arr = _from_sglang(data, path)
        else:
            arr = _as_counts(data, path, "")
        if arr.ndim == 2:
            arr = arr[None]
        trace = Trace(arr, path, fmt, [str(i) for i in range(arr.shape[1])])
        if num_experts is not None and trace.num_experts != num_experts:
            raise InputError(path, "", f"wrong shape: {trace.num_experts} experts per layer, "
                                       f"the instance says num_experts={num_experts}")
    _check_not_empty(trace)
    return trace


def detect_format(path: Path) -> str:
    """Guess the format from the path and (for JSON) the top-level keys."""
    if path.is_dir():
        return "topk"
    suffix = path.suffix.lower()
    if suffix in (".npy", ".csv"):
        return "matrix"
    if suffix == ".pt":
        return "sglang"
    if suffix == ".json":
        data = _load_json(path)
        if isinstance(data, list):
            return "matrix"
        if isinstance(data, dict):
            if "load_history" in data:
                return "vllm"
            if "logical_count" in data:
                return "sglang"
        raise InputError(path, "", "cannot detect the trace format: expected a JSON list (matrix), "
                                   "an object with load_history (vllm) or with logical_count (sglang)")
    raise InputError(path, "", f"cannot detect the trace format from suffix {suffix or '(none)'!r}; "
                               "give experts.format")


# ---------------------------------------------------------------- file loading

def _load_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(path, f"line {exc.lineno}", f"not valid JSON: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "", f"cannot read: {exc}") from None


def _load_file(path: Path, fmt: str):
    suffix = path.suffix.lower()
    if suffix == ".npy":
        if fmt != "matrix":
            raise InputError(path, "format", f".npy files hold a matrix, not a {fmt} trace")
        with open(path, "rb") as fh:
            magic = fh.read(6)
        if magic != b"\x93NUMPY":  # numpy calls anything else "pickled data": say what it is not
            raise InputError(path, "", "not a .npy file (no NumPy header); save the matrix with numpy.save")
        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(path, "", f"not a readable .npy array: {exc}") from None
    if suffix == ".csv":
        if fmt != "matrix":
            raise InputError(path, "format", f".csv files hold a matrix, not a {fmt} trace")
        return _load_csv(path)
    if suffix == ".pt":
        if fmt != "sglang":
            raise InputError(path, "format", f".pt files are SGLang recorder dumps, not {fmt} traces")
        return _load_pt(path)
    return _load_json(path)


def _load_csv(path: Path) -> list:
    windows: list[list[list[float]]] = [[]]
    try:
        rows = list(csv.reader(path.read_text().splitlines()))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(path, "", f"cannot read CSV: {exc}") from None
    for lineno, row in enumerate(rows, start=1):
        cells = [c.strip() for c in row]
        if not any(cells):
            if windows[-1]:
                windows.append([])
            continue
        values = []
        for col, c in enumerate(cells, start=1):
            try:
                values.append(float(c))
            except ValueError:
                if lineno == 1:
                    values = None
                    break
                raise InputError(path, f"line {lineno}, column {col}", f"not a number: {c!r}") from None
        if values is not None:
            windows[-1].append(values)
    if not windows[-1]:
        windows.pop()
    if not windows:
        raise InputError(path, "", "empty windows: the CSV holds no counts")
    return windows[0] if len(windows) == 1 else windows


def _load_pt(path: Path):
    try:
        import torch  # type: ignore
    except ImportError:
        raise InputError(path, "", "reading a .pt recorder dump needs torch (pip install "
                                   "'supernode-optimizer[torch]'), or save logical_count as JSON") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bad files
        raise InputError(path, "", f"cannot load the .pt file: {exc}") from None
    if isinstance(data, dict) and "logical_count" in data:
        lc = data["logical_count"]
        return {"logical_count": lc.tolist() if hasattr(lc, "tolist") else lc}
    raise InputError(path, "", "the .pt file holds no logical_count")


# ---------------------------------------------------------------- shape checks

def _where(idx: tuple[int, ...], ndim: int) -> str:
    names = ("layer", "expert") if ndim == 2 else ("window", "layer", "expert")
    return ", ".join(f"{n} {i}" for n, i in zip(names, idx))


MAX_COUNT = 1e12  # tokens per expert per window; keeps the integer models far from overflow


def _as_counts(data, path: Path, prefix: str) -> np.ndarray:
    """Turn nested lists / an array into int64 counts [L, E] or [W, L, E], checking shape."""
    pre = f"{prefix}: " if prefix else ""
    if isinstance(data, np.ndarray):
        arr = data
    else:
        if not isinstance(data, list) or not data:
            raise InputError(path, prefix, "wrong shape: expected a non-empty [layers, experts] or "
                                           "[windows, layers, experts] list")
        _check_ragged(data, path, prefix)
        try:
            arr = np.asarray(data, dtype=np.float64)
        except (ValueError, TypeError):
            raise InputError(path, prefix, "wrong shape: not a list of lists of numbers") from None
    if arr.ndim not in (2, 3):
        raise InputError(path, prefix, f"wrong shape: {arr.ndim} dimensions {list(arr.shape)}, "
                                       "expected [layers, experts] or [windows, layers, experts]")
    if arr.size == 0:
        raise InputError(path, prefix, f"empty windows: shape {list(arr.shape)} holds no counts")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise InputError(path, prefix, f"wrong type: {arr.dtype} is not a number type")
    arr = arr.astype(np.float64)
    bad = np.argwhere(~np.isfinite(arr))
    if bad.size:
        raise InputError(path, pre + _where(tuple(bad[0]), arr.ndim), "count is not a finite number")
    neg = np.argwhere(arr < 0)
    if neg.size:
        i = tuple(neg[0])
        raise InputError(path, pre + _where(i, arr.ndim), f"negative count {arr[i]:g}")
    big = np.argwhere(arr > MAX_COUNT)
    if big.size:
        i = tuple(big[0])
        raise InputError(path, pre + _where(i, arr.ndim), f"count {arr[i]:g} exceeds {MAX_COUNT:.0e} tokens")
    frac = np.argwhere(arr != np.round(arr))
    if frac.size:
        i = tuple(frac[0])
        raise InputError(path, pre + _where(i, arr.ndim), f"count {arr[i]:g} is not a whole number of tokens")
    return arr.astype(np.int64)


def _check_ragged(data: list, path: Path, prefix: str) -> None:
    """Find the first list whose length differs from its siblings' (names the position)."""
    pre = f"{prefix}: " if prefix else ""
    depth3 = isinstance(data[0], list) and data[0] and isinstance(data[0][0], list)
    if depth3:
        for w, win in enumerate(data):
            if not isinstance(win, list) or not win or not isinstance(win[0], list):
                raise InputError(path, f"{pre}window {w}", "wrong shape: expected a [layers, experts] list")
            if len(win) != len(data[0]):
                raise InputError(path, f"{pre}window {w}", f"layers disagree: {len(win)} layers, "
                                                          f"window 0 has {len(data[0])}")
            _check_rows(win, path, f"{pre}window {w}, ", len(data[0][0]))
    else:
        _check_rows(data, path, pre, len(data[0]) if isinstance(data[0], list) else -1)


def _check_rows(rows: list, path: Path, pre: str, width: int) -> None:
    for layer, row in enumerate(rows):
        if not isinstance(row, list):
            raise InputError(path, f"{pre}layer {layer}", "wrong shape: expected a list of per-expert counts")
        if len(row) != width:
            raise InputError(path, f"{pre}layer {layer}", f"wrong shape: {len(row)} experts, "
                                                          f"layer 0 has {width}")
        for e, v in enumerate(row):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(path, f"{pre}layer {layer}, expert {e}", f"not a number: {v!r}")


def _from_vllm(data, path: Path) -> np.ndarray:
    if not isinstance(data, dict) or "load_history" not in data:
        raise InputError(path, "load_history", "required field is missing")
    hist = data["load_history"]
    if not isinstance(hist, list) or not hist:
        raise InputError(path, "load_history", "empty windows: load_history holds no window")
    arrays = []
    for w, entry in enumerate(hist):
        if not isinstance(entry, dict) or "logical_expert_load" not in entry:
            raise InputError(path, f"load_history[{w}]", "expected an object with logical_expert_load")
        arr = _as_counts(entry["logical_expert_load"], path, f"load_history[{w}]")
        if arr.ndim != 2:
            raise InputError(path, f"load_history[{w}]", f"wrong shape: {list(arr.shape)}, expected [layers, experts]")
        if arrays and arr.shape[0] != arrays[0].shape[0]:
            raise InputError(path, f"load_history[{w}]", f"layers disagree: {arr.shape[0]} layers, "
                                                         f"window 0 has {arrays[0].shape[0]}")
        if arrays and arr.shape[1] != arrays[0].shape[1]:
            raise InputError(path, f"load_history[{w}]", f"wrong shape: {arr.shape[1]} experts, "
                                                         f"window 0 has {arrays[0].shape[1]}")
        arrays.append(arr)
    return np.stack(arrays)


def _from_sglang(data, path: Path) -> np.ndarray:
    if not isinstance(data, dict) or "logical_count" not in data:
        raise InputError(path, "logical_count", "required field is missing")
    return _as_counts(data["logical_count"], path, "logical_count")


def _check_not_empty(trace: Trace) -> None:
    totals = trace.loads.sum(axis=(1, 2))
    empty = np.flatnonzero(totals == 0)
    if empty.size:
        w = int(empty[0])
        raise InputError(trace.file, f"{trace.window_kind} {w}", "empty window: no tokens routed in any layer")


# ---------------------------------------------------------------- topk folders

def _read_topk(folder: Path, num_experts: int | None, window_tokens: int | None, top_k: int | None) -> Trace:
    files = {}
    for p in folder.iterdir():
        m = _TOPK_NAME.match(p.name)
        if m:
            files[int(m.group(1))] = p
    if not files:  # first: a folder that is no topk trace at all (a fresh user's /tmp was asked for num_experts)
        raise InputError(folder, "", "no expert_weights_<layer>.txt files in the folder (a topk trace)")
    if num_experts is None:
        raise InputError(folder, "num_experts", "required for topk traces (expert ids are checked against it)")
    layer_ids = sorted(files)
    per_layer = []  # per layer: list of per-sequence id arrays
    lengths_ref: list[int] | None = None
    ref_file = None
    for lid in layer_ids:
        seqs = _parse_topk_file(files[lid], num_experts)
        lengths = [len(s) for s in seqs]
        if lengths_ref is None:
            lengths_ref, ref_file = lengths, files[lid]
        elif len(lengths) != len(lengths_ref):
            raise InputError(files[lid], "", f"layers disagree: {len(lengths)} sequences, "
                                             f"{ref_file.name} has {len(lengths_ref)}")
        elif lengths != lengths_ref:
            i = next(k for k, (a, b) in enumerate(zip(lengths, lengths_ref)) if a != b)
            raise InputError(files[lid], f"line {i + 1}", f"layers disagree: {lengths[i]} expert ids, "
                                                          f"{ref_file.name} has {lengths_ref[i]}")
        per_layer.append(seqs)
    assert lengths_ref is not None and ref_file is not None
    if top_k is None:
        top_k = 0
        for n in lengths_ref:
            top_k = math.gcd(top_k, n)
    for lid, seqs in zip(layer_ids, per_layer):
        for line, ids in enumerate(seqs, start=1):
            if len(ids) % top_k:
                raise InputError(files[lid], f"line {line}", f"wrong shape: {len(ids)} expert ids is not a "
                                                             f"multiple of top_k={top_k}")
            tok = ids.reshape(-1, top_k)
            srt = np.sort(tok, axis=1)
            dup = np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1)) if top_k > 1 else np.array([])
            if dup.size:
                raise InputError(files[lid], f"line {line}, token {int(dup[0]) + 1}",
                                 f"wrong shape: an expert id repeats within one token's top-{top_k} "
                                 "(give experts.top_k if the inferred value is wrong)")
    tokens = [n // top_k for n in lengths_ref]
    L = len(layer_ids)
    if window_tokens is None:
        W = len(tokens)
        loads = np.zeros((W, L, num_experts), dtype=np.int64)
        for li, seqs in enumerate(per_layer):
            for w, ids in enumerate(seqs):
                loads[w, li] = np.bincount(ids, minlength=num_experts)
        kind, tpw = "sequence", tokens
    else:
        total = sum(tokens)
        W = total // window_tokens
        if W == 0:
            raise InputError(folder, "window_tokens", f"empty windows: the trace holds {total} tokens, "
                                                      f"fewer than one window of {window_tokens}")
        loads = np.zeros((W, L, num_experts), dtype=np.int64)
        for li, seqs in enumerate(per_layer):
            flat = np.concatenate(seqs)[: W * window_tokens * top_k].reshape(W, window_tokens * top_k)
            for w in range(W):
                loads[w, li] = np.bincount(flat[w], minlength=num_experts)
        kind, tpw = f"{window_tokens}-token window", [window_tokens] * W
    return Trace(loads, folder, "topk", [str(x) for x in layer_ids], kind, top_k, tpw)


def _parse_topk_file(path: Path, num_experts: int) -> list[np.ndarray]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "", f"cannot read: {exc}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise InputError(path, "", "empty windows: the file holds no sequence")
    seqs = []
    for n, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        ids_part, sep, weights_part = line.partition("\t\t")
        if not ids_part.strip():
            raise InputError(path, f"line {n}", "empty window: the sequence has no tokens")
        cells = ids_part.split("\t")
        try:
            ids = np.array([int(c) for c in cells], dtype=np.int64)
        except ValueError:
            bad = next(c for c in cells if not c.strip().lstrip("-").isdigit())
            raise InputError(path, f"line {n}", f"expert id {bad!r} is not an integer") from None
        out = np.flatnonzero((ids < 0) | (ids >= num_experts))
        if out.size:
            k = int(out[0])
            raise InputError(path, f"line {n}, id {k + 1}", f"expert id {ids[k]} out of range 0..{num_experts - 1}")
        if sep:
            nw = len(weights_part.split("\t"))
            if nw != len(ids):
                raise InputError(path, f"line {n}", f"wrong shape: {len(ids)} expert ids but {nw} gate weights")
        seqs.append(ids)
    return seqs


def lognormal_loads(seed: int = 0, layers: int = 58, experts: int = 256, tokens: int = 16384, top_k: int = 8,
                    sigma: float = 1.0) -> np.ndarray:
    """A seeded synthetic routing load, ``[layers, experts]`` token counts: per layer, expert
    popularity drawn lognormal(0, ``sigma``) and ``tokens·top_k`` routed tokens drawn multinomially
    (a DeepSeek-V3-shaped trace by default: 58 MoE layers, 256 experts, top-8), for tests and
    benchmarks."""
    rng = np.random.default_rng(seed)
    out = np.zeros((layers, experts), dtype=np.int64)
    for i in range(layers):
        p = rng.lognormal(0.0, sigma, experts)
        out[i] = rng.multinomial(tokens * top_k, p / p.sum())
    return out
