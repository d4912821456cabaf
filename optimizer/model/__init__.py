"""The one inference performance model shared by every problem.

``optimizer.model`` turns a model description (a HuggingFace ``config.json`` or an inventory
file) into what each GPU stores, reads, computes and sends per step. Problems (deployment,
serving, supernode) decide; this package only computes. No solver imports here.
"""
