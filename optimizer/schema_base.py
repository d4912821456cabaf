"""Shared schema conventions: strict pydantic models, YAML loading, error conversion.

Every input model is frozen and forbids unknown keys, so a typo is an error rather than
a silently ignored field. Units live in field names (``memory_gb``, ``latency_us``); they
are converted exactly once, when the resolved problem is built.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import re

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optimizer.errors import InputError

# input limits shared by every problem that counts servers (deployment, serving): beyond them the
# models stop being instances of one fabric and the solvers' integer bounds stop being tight
MAX_SERVERS = 4096
MAX_GPUS_PER_SERVER = 1024


class StrictModel(BaseModel):
    """Base of every input model: frozen, unknown keys rejected, no coercion of str to number."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class RopeScalingIn(StrictModel):
    """``model.rope_scaling`` (deployment and serving): RoPE scaling enabled at serving time
    (overrides the config's ``rope_scaling``), e.g. Qwen's documented ``{rope_type: yarn, factor: 4,
    original_max_position_embeddings: 32768}`` for 131,072 tokens. Sets the maximum context as
    vLLM does (:func:`optimizer.model.config.max_model_len`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    rope_type: Literal["yarn", "linear", "dynamic", "llama3", "longrope"]
    factor: float = Field(gt=0, le=1e4)
    original_max_position_embeddings: Optional[int] = Field(default=None, gt=0, le=100_000_000)


class PerformanceIn(StrictModel):
    """``performance:`` (deployment and serving): where step times come from
    (:mod:`optimizer.model.steptimes`)."""

    source: Literal["auto", "analytic", "measured", "chapter"] = Field(
        default="auto", description="auto: measured where the database covers the GPU, engine and model, else "
                                    "analytic; analytic: the roofline on fitted achieved peaks; chapter: the "
                                    "roofline at the datasheet peaks, as the reference chapter")
    engine: Optional[Literal["vllm", "sglang", "trtllm"]] = None
    engine_version: Optional[str] = Field(default=None, min_length=1)
    memory_fraction: Optional[float] = Field(default=None, gt=0, le=1)
    calibration: Optional[str] = Field(default=None, min_length=1, description="factors from optimize calibrate")
    gemm_quant: Optional[Literal["bfloat16", "fp8", "fp8_block", "nvfp4", "int8_wo", "int4_wo"]] = Field(
        default=None, description="the measured database's GEMM (and MoE) kernel lane; default from model.weight_dtype")


def _loc_to_field(loc: tuple[Any, ...], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic puts union member / function tags in loc; keep only real field names
            if str(part).startswith("function-") or "[" in str(part) and "]" in str(part) and not out:
                continue
            out = f"{out}.{part}" if out else str(part)
    return out


def validation_error_to_input_error(err: ValidationError, file: str | Path, prefix: str = "") -> InputError:
    """Turn a pydantic error into an InputError naming file, dotted field and problem.

    For a value that may be a name or a mapping (``gpu: h100-sxm`` or an inline mapping) the
    most specific error is reported (the deepest field path), and union branch tags
    (``str``, model class names) are dropped from the path.
    """
    errors = err.errors()

    def clean(loc):
        return tuple(p for p in loc if not (isinstance(p, str) and (
            p.startswith("function-") or p in {"str", "int", "float", "dict", "list", "bool", "none"}
            or p[:1].isupper() or "[" in p or p.startswith(("constrained-", "lax-or-strict", "json-or-python")))))

    # an unknown key first: a misspelt field (``bandwidth:``) also leaves the real one missing,
    # and "unknown key" names the cause where "required field is missing" names the symptom
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = max(unknown or errors, key=lambda e: len(clean(e["loc"])))
    field = _loc_to_field(clean(first["loc"]), prefix)
    # pydantic's wording names our classes ("a valid dictionary or instance of LinkIn"): say mapping
    msg = re.sub(r"valid dictionary or instance of \w+", "mapping", first["msg"])
    msg = re.sub(r" or instance of \w+", "", msg)
    msg = re.sub(r"^(Value error|Assertion failed), ", "", msg)  # our validators' own words, without pydantic's prefix
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "required field is missing"
    if "input" in first and first["type"] not in ("missing", "extra_forbidden") and not isinstance(first["input"], (dict, list)):
        msg = f"{msg} (got {first['input']!r})"
        if first["type"] == "string_type" and isinstance(first["input"], (int, float)) \
                and not isinstance(first["input"], bool):  # YAML read 0.24 or 9.9 as a number
            msg += "; quote it to keep it text (\"0.10\" would otherwise read as 0.1)"
    return InputError(file, field, msg)


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader (libyaml's C parser where PyYAML has it: a 3,000-group instance read in 0.1 s
    instead of 1 s) that also reads ``2e3`` as a number (YAML 1.2; PyYAML's 1.1 rules need
    ``2.0e+3``) and rejects a key given twice in one mapping."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def validate(cls, data: Any, file: str | Path, prefix: str = ""):
    """``cls.model_validate(data)`` with pydantic's errors turned into one :class:`InputError`
    line (file, dotted field under ``prefix``, problem).

    Raises:
        InputError: the first validation error.
    """
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise validation_error_to_input_error(err, file, prefix) from None


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key '{key}' is given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1})",
                key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_yaml_text(text: str) -> Any:
    """Parse YAML text with the project's loader (see :class:`_Loader`)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def existing_file(instance: str | Path, field: str, path: Path, what: str = "file") -> Path:
    """``path`` (named by ``field`` of ``instance``) when it is a file.

    Raises:
        InputError: one line naming the instance, the field and whether ``path`` is missing or
            a folder.
    """
    if not path.exists():
        raise InputError(instance, field, f"{what} not found: {path}")
    if not path.is_file():
        raise InputError(instance, field, f"is a folder, expected a {what}: {path}")
    return path


def read_utf8(path: Path, what: str) -> str:
    """The text of ``path``, read as UTF-8.

    Raises:
        InputError: no such file; not UTF-8 (names the byte, and ``what`` the file should be).
    """
    if not Path(path).is_file():
        raise InputError(path, "", "no such file")
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, "", f"not UTF-8 text (byte {exc.start}): {what}") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path``.

    Raises:
        InputError: the file is missing, unreadable, not YAML, or not a mapping.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(p, "", "file not found")
    if p.is_dir():
        raise InputError(p, "", "is a folder, expected a YAML file")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(p, "", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(p, f"byte {exc.start}", "not UTF-8 text (a YAML file is expected)") from None
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise InputError(p, where, f"not valid YAML: {problem}" if problem else "not valid YAML") from None
    if not isinstance(data, dict):
        raise InputError(p, "", "expected a YAML mapping at the top level")
    return data


def apply_overrides(raw: dict[str, Any], overrides: list[str], file: str | Path) -> dict[str, Any]:
    """Apply ``--set dotted.key=value`` overrides to a raw instance mapping (a copy).

    The value is parsed as YAML (``4``, ``[4]``, ``null``, ``{at_ms: 20, stall_ms: 40}``).
    A path segment that is an integer indexes a list (``workload.sessions.0.count=2``).

    Raises:
        InputError: malformed override, or a path through a non-container.
    """
    import copy

    data = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise InputError(file, item, "--set expects dotted.key=value")
        key, _, value_text = item.partition("=")
        parts = [k.strip() for k in key.strip().split(".")]
        if not key.strip() or not all(parts):  # 'a..b' or 'a.' is a typo, not a key
            raise InputError(file, item, "--set expects dotted.key=value (no empty key between dots)")
        try:
            value = load_yaml_text(value_text) if value_text.strip() else None
        except yaml.YAMLError:
            raise InputError(file, key, f"--set value {value_text!r} is not valid YAML") from None
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            nxt = _child(node, part, key, file)
            if nxt is None:
                nxt = {}
                _assign(node, part, nxt, key, file)
            node = nxt
        _assign(node, parts[-1], value, key, file)
    return data


def _child(node: Any, part: str, key: str, file: str | Path) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and part.lstrip("-").isdigit():
        idx = int(part)
        if 0 <= idx < len(node):  # no negative indices: "-1" is not a position a reader sees in the file
            return node[idx]
        raise InputError(file, key, f"--set index {idx} is out of range (list has {len(node)} items, 0 to "
                                    f"{len(node) - 1})")
    raise InputError(file, key, f"--set cannot descend into {type(node).__name__} at '{part}'")


def _assign(node: Any, part: str, value: Any, key: str, file: str | Path) -> None:
    if isinstance(node, dict):
        node[part] = value
    elif isinstance(node, list) and part.lstrip("-").isdigit():
        idx = int(part)
        if not 0 <= idx < len(node):
            raise InputError(file, key, f"--set index {idx} is out of range (list has {len(node)} items, 0 to "
                                        f"{len(node) - 1})")
        node[idx] = value
    else:
        raise InputError(file, key, f"--set cannot assign into {type(node).__name__} at '{part}'")
