"""Weight and KV-cache dtypes read from the checkpoint and the engine when an instance names none.

The one place the deployment and serving schemas take ``model.weight_dtype`` and ``model.kv_dtype``
from when the instance leaves them out (issue #38: defaults read from the checkpoint and the engine,
never assumed). An instance's own ``model.weight_dtype`` / ``model.kv_dtype`` always wins.

What the checkpoint declares comes from config.json's ``quantization_config`` (also
``compression_config``, or a ``text_config``'s for multimodal wrappers) or, when it has none, from
the ModelOpt ``hf_quant_config.json`` beside it (:func:`quant_file`):

* the format (``method``): ``none``, ``fp8`` (``quant_method: fp8``, block- or per-tensor-scaled
  FP8 weights such as Qwen/Qwen3-32B-FP8), ``modelopt`` (``quant_method: modelopt*``, a ModelOpt
  ``producer`` or the nested ``{"quantization": {...}}`` form), ``compressed-tensors``, or any other
  ``quant_method`` as written;
* the KV cache it declares (``kv``): ``kv_cache_quant_algo`` (a name: FP8, NVFP4, INT8) or
  ``kv_cache_scheme`` (a name, or a mapping ``{num_bits, type, dynamic, strategy, symmetric}``);
* the weights' dtype (:func:`weights_of`).

The weights' dtype follows from the format alone. The KV cache's depends on the engine as well:
what vLLM, SGLang and TensorRT-LLM store when their KV-cache option is left at ``auto`` is the rule
table ``instances/engines/kv_defaults.yaml`` (each rule with the engine source it was read from).
A checkpoint without a quantization_config keeps the engines' ``auto``: the model's own 16-bit
dtype, recorded as ``bf16`` (fp16 has the same bytes and peak), for weights and KV alike.

Bad input (one line naming the file, the field and the problem): a quantization_config that is not
a mapping, a missing or non-string ``quant_method`` where no ModelOpt marker says the format, a KV
declaration of the wrong type or an unknown value, a ``config_groups`` or ``quant_algo`` that cannot
be read when the weights' dtype is taken from it, an unreadable hf_quant_config.json; and a
checkpoint whose weights mix dtypes (or whose format this module does not know) when the instance
names no ``model.weight_dtype``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import yaml

from optimizer.errors import InputError

RULES_FILE = Path(__file__).resolve().parents[2] / "instances" / "engines" / "kv_defaults.yaml"
UNQUANTIZED = "bf16"
"""The dtype of weights and KV cache of a checkpoint without a quantization_config (the engines'
``auto``: the model's 16-bit dtype; bf16 and fp16 have the same bytes and tensor-core peak)."""

# KV-cache names a kv_cache_quant_algo / kv_cache_scheme may hold -> the optimiser's dtype names
KV_NAMES = {"FP8": "fp8", "FP8_E4M3": "fp8", "NVFP4": "fp4", "INT8": "int8"}
# (num_bits, type) of a kv_cache_scheme mapping -> dtype
KV_SCHEMES = {(8, "float"): "fp8", (4, "float"): "fp4", (8, "int"): "int8"}
# ModelOpt quant_algo -> the weights' dtype (MIXED_PRECISION: per layer, no one dtype)
MODELOPT_WEIGHTS = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "FP8_PB_WO": "fp8", "FP8_BLOCK_SCALES": "fp8",
                    "MXFP8": "fp8", "NVFP4": "fp4", "W4A16_NVFP4": "fp4", "W4A8_NVFP4_FP8": "fp4", "W4A16_AWQ": "int4",
                    "W4A8_AWQ": "int4", "W4A16_GPTQ": "int4", "W8A16": "int8", "W8A8_SQ_PER_CHANNEL": "int8"}
# compressed-tensors config_groups weights (num_bits, type) -> dtype
CT_WEIGHTS = {(8, "float"): "fp8", (4, "float"): "fp4", (8, "int"): "int8", (4, "int"): "int4"}
# other quant_methods whose weights' dtype is fixed by the method, and those given by "bits"
FIXED_WEIGHTS = {"fp8": "fp8", "mxfp8": "fp8", "mxfp4": "fp4", "nvfp4": "fp4"}
BITS_METHODS = frozenset({"awq", "awq_marlin", "gptq", "gptq_marlin", "auto-round", "auto_round"})
BITS_WEIGHTS = {4: "int4", 8: "int8"}


@dataclass(frozen=True)
class Quantization:
    """What one quantization config (a config.json's quantization_config or an hf_quant_config.json)
    declares; ``method == "none"``: nothing (no quantization config).

    Attributes:
        method: none | fp8 | modelopt | compressed-tensors | another quant_method (lower case).
        kv: none | fp8 | fp4 | int8, the KV cache the checkpoint declares.
        kv_field: kv_cache_quant_algo | kv_cache_scheme ("" without a declaration).
        kv_form: name | mapping ("" without a declaration).
        layout: flat | nested (ModelOpt's {"quantization": {...}} form).
        dynamic, strategy, symmetric: those fields of a kv_cache_scheme mapping (None: absent).
        file: where it was read; prefix: the field path of its root in that file.
        raw: the mapping itself (the weights' dtype is read from it on demand).
    """

    method: str = "none"
    kv: str = "none"
    kv_field: str = ""
    kv_form: str = ""
    layout: str = "flat"
    dynamic: Optional[bool] = None
    strategy: Optional[str] = None
    symmetric: Optional[bool] = None
    file: Optional[Path] = None
    prefix: str = ""
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def features(self, mla: bool) -> dict[str, Any]:
        """The values the rules' ``when`` keys are matched against."""
        return {"method": self.method, "kv": self.kv, "kv_field": self.kv_field or None,
                "kv_form": self.kv_form or None, "layout": self.layout, "dynamic": self.dynamic,
                "strategy": self.strategy, "symmetric": self.symmetric, "attention": "mla" if mla else "gqa"}

    def describe(self) -> str:
        """A short description for messages: format and KV declaration, with the file."""
        if self.method == "none":
            return "no quantization_config"
        where = self.file.name if self.file is not None else "config"
        if self.kv == "none":
            kv = "no KV-cache scheme"
        elif self.kv_form == "name":
            kv = f"{self.kv_field} {self.kv.upper()}"
        else:
            kv = f"{self.kv_field} {self.kv.upper()} mapping"
        return f"{where} {self.method}, {kv}"


@dataclass(frozen=True)
class Dtypes:
    """The resolved dtypes of an instance's model and where each came from.

    Attributes:
        weight_dtype, kv_dtype: dtype names (:data:`optimizer.model.decode.DTYPE_BYTES`).
        weight_source, kv_source: where each came from ("model.kv_dtype" when the instance gave it).
        quant_method: the checkpoint's quantization format (None: unquantized, or not read because
            the instance gave both dtypes and the checkpoint says no quant_method).
        derived: True when a default was taken from a quantized checkpoint (the plan says so).
    """

    weight_dtype: str
    kv_dtype: str
    weight_source: str
    kv_source: str
    quant_method: Optional[str] = None
    derived: bool = False

    def as_dict(self) -> dict[str, str]:
        """The JSON record: ``weight_dtype``, ``weight_dtype_source``, ``kv_dtype``, ``kv_dtype_source``."""
        return {"weight_dtype": self.weight_dtype, "weight_dtype_source": self.weight_source,
                "kv_dtype": self.kv_dtype, "kv_dtype_source": self.kv_source}

    def line(self) -> str:
        """One line for the text reports."""
        return (f"dtypes: weights {self.weight_dtype} ({self.weight_source}); "
                f"KV cache {self.kv_dtype} ({self.kv_source})")


# ------------------------------------------------------------------ reading the checkpoint
def quant_file(config_file: Path) -> Path:
    """The hf_quant_config.json that belongs to ``config_file``: beside a ``config.json`` (the
    HuggingFace layout), ``<name>_hf_quant_config.json`` beside ``<name>_config.json``
    (aiconfigurator's model_configs), else ``<stem>.hf_quant_config.json`` beside ``<stem>.json``."""
    name = config_file.name
    if name == "config.json":
        return config_file.with_name("hf_quant_config.json")
    if name.endswith("_config.json"):
        return config_file.with_name(name[: -len("config.json")] + "hf_quant_config.json")
    return config_file.with_name(config_file.stem + ".hf_quant_config.json")


def _inline(raw: dict) -> tuple[Any, str]:
    for key in ("quantization_config", "compression_config"):
        if raw.get(key) is not None:
            return raw[key], key
    text = raw.get("text_config")
    if isinstance(text, dict) and text.get("quantization_config") is not None:
        return text["quantization_config"], "text_config.quantization_config"
    return None, ""


def read_quantizations(config_file: Path, raw: dict) -> tuple[Quantization, Quantization]:
    """``(inline, file)``: what config.json's quantization config declares and what the
    hf_quant_config.json beside it (:func:`quant_file`) declares; ``Quantization()`` for an absent one.

    Raises:
        InputError: a malformed declaration (module docstring), naming its file and field.
    """
    q, key = _inline(raw)
    inline = parse_quantization(q, Path(config_file), key) if q is not None else Quantization()
    f = quant_file(Path(config_file))
    if not f.is_file():
        return inline, Quantization()
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f, "", f"cannot read the ModelOpt quantization file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f, f"line {exc.lineno}", f"not valid JSON: {exc.msg}") from None
    return inline, parse_quantization(data, f, "")


def _where(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def parse_quantization(q: Any, file: Path, prefix: str) -> Quantization:
    """Read one quantization config mapping (module docstring).

    Raises:
        InputError: not a mapping; no quant_method and no ModelOpt marker; a bad KV declaration.
    """
    if not isinstance(q, dict):
        raise InputError(file, prefix, f"expected a mapping (the checkpoint's quantization), got {type(q).__name__}")
    method = q.get("quant_method")
    nested = isinstance(q.get("quantization"), dict)
    if method is not None and not isinstance(method, str):
        raise InputError(file, _where(prefix, "quant_method"), f"expected a name such as fp8, modelopt or "
                                                               f"compressed-tensors (got {method!r})")
    producer = q.get("producer")
    modelopt_producer = isinstance(producer, dict) and producer.get("name") == "modelopt"
    if method:
        method = method.strip().lower().replace("compressed_tensors", "compressed-tensors")
        if method.startswith("modelopt"):
            method = "modelopt"
    elif modelopt_producer or nested or q.get("quant_algo") is not None:
        method = "modelopt"
    else:
        raise InputError(file, _where(prefix, "quant_method"), "missing: the quantization format (fp8, modelopt, "
                                                               "compressed-tensors, ...) is not stated")
    if method == "modelopt" and nested:
        inner, inner_prefix = q["quantization"], _where(prefix, "quantization")
    else:
        inner, inner_prefix = q, prefix
    kv = _kv(inner, file, inner_prefix)
    if kv is None and inner is not q:
        kv = _kv(q, file, prefix)
    base = Quantization(method=method, layout="nested" if method == "modelopt" and nested else "flat", file=file,
                        prefix=prefix, raw=q)
    if kv is None:
        return base
    kv_dtype, kv_field, kv_form, scheme = kv
    return Quantization(method=method, kv=kv_dtype, kv_field=kv_field, kv_form=kv_form, layout=base.layout,
                        dynamic=scheme.get("dynamic"), strategy=scheme.get("strategy"),
                        symmetric=scheme.get("symmetric"), file=file, prefix=prefix, raw=q)


def _kv(q: dict, file: Path, prefix: str) -> Optional[tuple[str, str, str, dict]]:
    """The KV-cache declaration of one mapping: (dtype, field, form, scheme fields), None without one.
    kv_cache_scheme is read first, then kv_cache_quant_algo (vLLM's order)."""
    for key in ("kv_cache_scheme", "kv_cache_quant_algo"):
        v = q.get(key)
        if v is None:
            continue
        where = _where(prefix, key)
        if isinstance(v, str):
            name = v.strip().upper()
            if name not in KV_NAMES:
                raise InputError(file, where, f"unknown KV-cache quantization {v!r} (one of {', '.join(KV_NAMES)}, "
                                              f"or null for none)")
            return KV_NAMES[name], key, "name", {}
        if key == "kv_cache_scheme" and isinstance(v, dict):
            bits, kind = v.get("num_bits"), v.get("type")
            if isinstance(bits, bool) or not isinstance(bits, int) or not isinstance(kind, str):
                raise InputError(file, where, f"expected num_bits (an integer) and type (float or int), got "
                                              f"num_bits {bits!r}, type {kind!r}")
            dtype = KV_SCHEMES.get((bits, kind.lower()))
            if dtype is None:
                raise InputError(file, where, f"a {bits}-bit {kind} KV cache is not one the engines store "
                                              f"(8-bit float, 4-bit float or 8-bit int)")
            for name, types in (("dynamic", bool), ("symmetric", bool), ("strategy", str)):
                if v.get(name) is not None and not isinstance(v[name], types):
                    raise InputError(file, f"{where}.{name}", f"expected a {types.__name__}, got {v[name]!r}")
            return dtype, key, "mapping", {k: v.get(k) for k in ("dynamic", "strategy", "symmetric")}
        raise InputError(file, where, f"expected {'a mapping {num_bits, type, ...} or ' if key == 'kv_cache_scheme' else ''}"
                                      f"a name such as FP8, or null (got {v!r})")
    return None


def weights_of(q: Quantization) -> tuple[Optional[str], str]:
    """``(dtype, what said it)``: the weights' dtype a quantization config gives (None: it does not
    say one, e.g. ModelOpt MIXED_PRECISION or compressed-tensors groups of different dtypes, or a
    format not listed) and the field that says it.

    Raises:
        InputError: a quant_algo, config_groups or bits field that cannot be read.
    """
    m, raw, file = q.method, q.raw, q.file
    if m == "none":
        return UNQUANTIZED, "no quantization_config"
    if m in FIXED_WEIGHTS:
        return FIXED_WEIGHTS[m], f"quant_method {m}"
    if m == "modelopt":
        inner, prefix = (raw["quantization"], _where(q.prefix, "quantization")) if q.layout == "nested" else (raw, q.prefix)
        algo = inner.get("quant_algo")
        if not isinstance(algo, str) or not algo:
            raise InputError(file, _where(prefix, "quant_algo"), f"expected ModelOpt's quantization name (FP8, NVFP4, "
                                                                 f"...), got {algo!r}")
        return MODELOPT_WEIGHTS.get(algo.strip().upper()), f"ModelOpt quant_algo {algo}"
    if m == "compressed-tensors":
        groups = raw.get("config_groups")
        where = _where(q.prefix, "config_groups")
        if not isinstance(groups, dict) or not groups:
            raise InputError(file, where, f"expected a mapping of quantization groups, got {groups!r}")
        found, said = set(), set()
        for name, g in groups.items():
            w = g.get("weights") if isinstance(g, dict) else None
            if not isinstance(w, dict):
                raise InputError(file, f"{where}.{name}.weights", "expected a mapping {num_bits, type, ...}")
            bits, kind = w.get("num_bits"), w.get("type")
            if isinstance(bits, bool) or not isinstance(bits, int) or not isinstance(kind, str):
                raise InputError(file, f"{where}.{name}.weights", f"expected num_bits (an integer) and type (float "
                                                                  f"or int), got num_bits {bits!r}, type {kind!r}")
            found.add(CT_WEIGHTS.get((bits, kind.lower())))
            said.add(f"{bits}-bit {kind}")
        return (found.pop() if len(found) == 1 else None), f"compressed-tensors weights {', '.join(sorted(said))}"
    if m in BITS_METHODS:
        bits = raw.get("bits", raw.get("w_bit"))
        if isinstance(bits, bool) or not isinstance(bits, int):
            raise InputError(file, _where(q.prefix, "bits"), f"expected the weights' bit width (4 or 8), got {bits!r}")
        return BITS_WEIGHTS.get(bits), f"{m} bits {bits}"
    return None, f"quant_method {m}"


# ------------------------------------------------------------------ the engines' rules
@lru_cache(maxsize=1)
def rules() -> dict:
    """The rule table ``instances/engines/kv_defaults.yaml`` (``engines: {name: {auto, rules, ...}}``)."""
    with RULES_FILE.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)["engines"]


def _version_key(v: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(v)
    except InvalidVersion:
        return None


def _holds(when: dict, features: dict) -> bool:
    for k, want in when.items():
        have = features.get(k)
        if isinstance(want, list):
            if have not in want:
                return False
        elif have != want:
            return False
    return True


def engine_kv(q: Quantization, engine: str, version: Optional[str], mla: bool) -> tuple[str, str]:
    """``(kv_dtype, why)``: what ``engine`` (at ``version``, None: any) stores with its KV-cache
    option at ``auto`` for a checkpoint declaring ``q`` (the first rule of
    :data:`RULES_FILE` that holds, else the engine's ``auto``)."""
    table = rules().get(engine)
    if table is None:
        return UNQUANTIZED, f"no rules for engine {engine}: the model's 16-bit dtype"
    at = f"{engine} {version}" if version else engine
    checked = ", ".join(table.get("checked", []))
    feats = q.features(mla)
    vk = _version_key(version) if version else None
    for i, r in enumerate(table.get("rules", [])):
        since = r.get("since")
        if since is not None and vk is not None and _version_key(str(since)) is not None and vk < _version_key(str(since)):
            continue
        if _holds(r.get("when", {}), feats):
            kv = q.kv if r["kv_dtype"] == "from_kv" else r["kv_dtype"]
            return kv, (f"{at} with {table.get('option', 'its KV-cache option')} auto stores {kv} for {q.describe()} "
                        f"(kv_defaults.yaml {engine} rule {i + 1}; checked on {checked})")
    auto = table["auto"]["kv_dtype"]
    if q.method == "none":
        why = "the engines' auto for an unquantized checkpoint: the model's 16-bit dtype"
    else:
        why = (f"{at} with {table.get('option', 'its KV-cache option')} auto keeps the model's 16-bit dtype for "
               f"{q.describe()} (kv_defaults.yaml {engine}; checked on {checked})")
    return auto, why


def _peek_method(config_file: Path) -> Optional[str]:
    """The checkpoint's quant_method without validating anything (both dtypes given)."""
    try:
        raw = json.loads(Path(config_file).read_text(encoding="utf-8"))
        q, _ = _inline(raw) if isinstance(raw, dict) else (None, "")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(q, dict):
        return "modelopt" if quant_file(Path(config_file)).is_file() else None
    m = q.get("quant_method")
    if isinstance(m, str) and m:
        m = m.lower().replace("compressed_tensors", "compressed-tensors")
        return "modelopt" if m.startswith("modelopt") else m
    return "modelopt"


def resolve(config_file: Path, engine: str, version: Optional[str], *, weight_dtype: Optional[str] = None,
            kv_dtype: Optional[str] = None, mla: bool = False, instance: Optional[Path] = None,
            where: str = "model", raw: Optional[dict] = None) -> Dtypes:
    """The instance's dtypes: ``weight_dtype`` / ``kv_dtype`` as given, else read from the checkpoint
    (``config_file``) and ``engine`` at ``version`` (module docstring).

    Args:
        config_file: the model's config.json; raw: its parsed mapping (None: read here).
        engine: vllm | sglang | trtllm; version: its release (None: rules without a version check).
        weight_dtype, kv_dtype: the instance's ``model.weight_dtype`` / ``model.kv_dtype`` (None: not given).
        mla: the model has multi-head latent attention (a rule may depend on it).
        instance, where: the instance file and its model section (for messages).
    Raises:
        InputError: a malformed quantization config (its file and field), or a checkpoint whose
            weights' dtype it does not state when the instance names none (``model.weight_dtype``).
    """
    if weight_dtype is not None and kv_dtype is not None:
        return Dtypes(weight_dtype, kv_dtype, f"{where}.weight_dtype", f"{where}.kv_dtype", _peek_method(config_file))
    if raw is None:
        from optimizer.model.config import read_json

        raw = read_json(Path(config_file))
    inline, from_file = read_quantizations(Path(config_file), raw)
    prefer_file = bool((rules().get(engine) or {}).get("prefer_file"))
    q = from_file if from_file.method != "none" and (prefer_file or inline.method == "none") else inline
    derived = False
    if weight_dtype is not None:
        ws = f"{where}.weight_dtype"
    else:
        weight_dtype, said = weights_of(q)
        if weight_dtype is None:
            raise InputError(instance, f"{where}.weight_dtype",
                             f"{q.file.name if q.file else Path(config_file).name}: {said} states no one dtype of "
                             f"the weights (mixed per layer, or a format this reader does not know): give "
                             f"{where}.weight_dtype")
        if q.method == "none":
            ws = "the checkpoint has no quantization_config: the model's 16-bit dtype"
        else:
            ws, derived = f"the checkpoint: {said} ({q.file.name if q.file else 'config'})", True
    if kv_dtype is not None:
        ks = f"{where}.kv_dtype"
    else:
        kv_dtype, ks = engine_kv(q, engine, version, mla)
        derived = derived or q.method != "none"
    return Dtypes(weight_dtype, kv_dtype, ws, ks, None if q.method == "none" else q.method, derived)
