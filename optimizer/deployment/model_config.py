"""Model of a deployment instance: a HuggingFace ``config.json`` read by :mod:`optimizer.model`.

Dense GQA, MoE, MLA and hybrid linear-attention configs are all read by
:func:`optimizer.model.config.read_hf_config`; this module keeps the deployment-side names.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from optimizer.model.config import ARCHITECTURES, ModelSpec, read_hf_config

ModelShape = ModelSpec  # the deployment problem's model is the shared model spec
SUPPORTED_ARCHITECTURES = ARCHITECTURES


def read_model_config(path: Path, rope_scaling: Optional[dict] = None) -> ModelSpec:
    """Parse a HuggingFace ``config.json`` (see :func:`optimizer.model.config.read_hf_config`).

    Args:
        path: the config file.
        rope_scaling: the instance's ``model.rope_scaling`` override, or None.
    Raises:
        InputError: missing/unreadable file, bad or missing fields, an unsupported feature.
    """
    return read_hf_config(Path(path), rope_scaling)
