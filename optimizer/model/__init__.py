"""The one inference performance model shared by every problem.

``optimizer.model`` turns a model description (a HuggingFace ``config.json`` or an inventory
file) into what each GPU stores, reads, computes and sends per step. Problems (deployment,
serving, supernode) decide; this package only computes. No solver imports here.

* :mod:`~optimizer.model.config`: ``config.json`` -> :class:`ModelSpec` (dense, MoE, MLA, hybrid;
  maximum context as vLLM derives it);
* :mod:`~optimizer.model.weights`: weight / KV / state inventory per component;
* :mod:`~optimizer.model.layout`: :class:`Layout` (attention TP x DP, experts TP x EP, PP),
  validation and enumeration;
* :mod:`~optimizer.model.perf`: memory per GPU (eq. 6-1) and batched decode step time
  (eqs. 6-2, 6-4/6-5, 6-7, 6-8, 6-9/6-10, All-to-All) per layout;
* :mod:`~optimizer.model.decode`: :class:`DecodeInventory` and :func:`decode_inventory`;
* :mod:`~optimizer.model.fabric`: scale-up fabric topology (torus, switched, NUMA staging), flows
  routed on it and collectives timed by the busiest directed link (chapter 6.5.1-6.5.4);
* :mod:`~optimizer.model.connections`: connection state per NIC and set-up time as a limit on
  domain size (chapter 6.5.5).
"""
from optimizer.model.config import ModelSpec, read_hf_config
from optimizer.model.decode import DecodeInventory, decode_inventory
from optimizer.model.hardware import Hardware, hardware_from_catalog
from optimizer.model.layout import Layout, check_layout, enumerate_layouts
from optimizer.model.perf import PerfModel, expected_active_experts, pipeline_time, pipeline_utilisation
from optimizer.model.weights import Weights, weights

__all__ = [
    "ModelSpec", "read_hf_config", "DecodeInventory", "decode_inventory", "Hardware", "hardware_from_catalog",
    "Layout", "check_layout", "enumerate_layouts", "PerfModel", "expected_active_experts", "pipeline_time",
    "pipeline_utilisation", "Weights", "weights",
]
