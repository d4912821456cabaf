"""Hardware catalog: ``instances/hardware/catalog.yaml`` (data with sources, not code).

The catalog file ships inside the repository; :func:`catalog_path` finds it next to the
package. Every entry carries a ``source`` string naming the datasheet or paper.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from optimizer.errors import InputError
from optimizer.schema_base import read_yaml


_NOT_SPECS = ("gpu_models", "generation")  # catalog bookkeeping, not fields of an inline GPU or server


def generation_of() -> dict[str, str]:
    """``{catalog GPU: architecture}`` (the ``generation`` field: hopper, ampere, blackwell, ada)."""
    return {g: e["generation"] for g, e in load_catalog()["gpus"].items() if e.get("generation")}


def catalog_path() -> Path:
    """Path of the hardware catalog YAML (``instances/hardware/catalog.yaml``)."""
    return Path(__file__).resolve().parent.parent / "instances" / "hardware" / "catalog.yaml"


@lru_cache(maxsize=1)
def load_catalog() -> dict[str, dict[str, dict[str, Any]]]:
    """Return ``{"gpus": {name: fields}, "servers": {name: fields}}`` from the catalog file.

    Raises:
        InputError: the catalog is missing or malformed.
    """
    data = read_yaml(catalog_path())
    for section in ("gpus", "servers"):
        if not isinstance(data.get(section), dict):
            raise InputError(catalog_path(), section, "catalog section missing or not a mapping")
    return data


def lookup(kind: str, name: str, file: str | Path, field: str) -> dict[str, Any]:
    """Catalog entry ``name`` of section ``kind`` ("gpus" or "servers"), without its sources
    (``source``, ``price_source``) and catalog bookkeeping (``gpu_models``, ``generation``).

    Raises:
        InputError: unknown name (the message lists the known names).
    """
    cat = load_catalog()[kind]
    if name not in cat:
        known = ", ".join(sorted(cat))
        raise InputError(file, field, f"unknown catalog name '{name}' (known: {known})")
    return {k: v for k, v in cat[name].items() if not k.endswith("source") and k not in _NOT_SPECS} | {"name": name}


def check_gpu_in_server(gpu: str, server: str, file: str | Path, field: str) -> None:
    """A catalog server lists the GPU models it holds (``gpu_models``); refuse another one.

    Raises:
        InputError: the server holds other GPUs (names both), or an unknown server name.
    """
    entry = load_catalog()["servers"].get(server)
    if entry is None:
        lookup("servers", server, file, field)  # raises the unknown-name error
    models = entry.get("gpu_models")
    if models and gpu not in models:
        raise InputError(file, field, f"server '{server}' holds {', '.join(models)} GPUs, not '{gpu}' "
                                      f"(pick a matching server, or give the server inline)")
