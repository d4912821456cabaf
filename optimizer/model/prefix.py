"""Prefix reuse: a prompt whose first tokens are already in the worker's KV cache (a shared system
prompt, a conversation's earlier turns) computes only the rest.

The engines keep finished requests' KV blocks and match new prompts against them: vLLM's
automatic prefix caching (hash per full KV block, on by default in the V1 engine,
``--enable-prefix-caching``), SGLang's RadixAttention (a radix tree over token ids, on unless
``--disable-radix-cache``). A hit turns the prompt's prefill into one chunk of the new tokens
after ``cached`` tokens of context (:meth:`StepTimes.mixed_step_s` with no decodes): the
linear layers run on the new tokens only, attention reads the cached prefix (``c·c0 + c(c+1)/2``
causal pairs, :func:`optimizer.model.prefill.chunk_attention_pairs`), and a disaggregated
prefill worker sends the new tokens' KV only (the decode workers hold the shared prefix too).
The KV memory per request is not reduced (the shared blocks counted per request, as if
unshared: the conservative side).

Model (per request): with probability ``hit_rate`` the first ``min(prefix_tokens, isl - 1)``
tokens are cached (at least one token is computed: the engines recompute the last one to get
its logits), else none. The expected tokens computed per request are then
``isl - hit_rate·min(prefix_tokens, isl - 1)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PrefixReuse:
    """A shared prompt prefix of ``prefix_tokens`` tokens found in the cache with probability
    ``hit_rate`` (0..1]; with ``per_request`` each request of a trace has its own prefix and
    ``prefix_tokens`` is their mean (the analytic model's figure)."""

    prefix_tokens: int
    hit_rate: float
    per_request: bool = False  # a trace's own prefix_tokens per request (prefix_tokens is then their mean)

    def cached(self, isl) -> np.ndarray:
        """Tokens served from the cache on a hit, ``min(prefix, isl - 1)`` (shape of ``isl``)."""
        return np.minimum(float(self.prefix_tokens), np.maximum(np.asarray(isl, dtype=float) - 1.0, 0.0))

    def points(self, isl: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The prompts as (new tokens, cached tokens, weight) points: each length point ``isl[i]``
        splits into a hit (weight ``w·hit_rate``) and a miss (``w·(1 - hit_rate)``).

        Args:
            isl: shape (n,), prompt lengths, tokens.
            weight: shape (n,), their weights (sum 1).
        Returns:
            three arrays of shape (2n,).
        """
        isl = np.asarray(isl, dtype=float)
        c = self.cached(isl)
        new = np.concatenate([isl - c, isl])
        cached = np.concatenate([c, np.zeros_like(isl)])
        w = np.concatenate([weight * self.hit_rate, weight * (1.0 - self.hit_rate)])
        return new, cached, w

    def expected_new_tokens(self, isl: float) -> float:
        """Expected tokens computed for a prompt of ``isl`` tokens (module docstring)."""
        return float(isl) - self.hit_rate * float(self.cached(isl))


def no_reuse(isl: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (new, cached, weight) points without prefix reuse: every prompt computed whole."""
    isl = np.asarray(isl, dtype=float)
    return isl, np.zeros_like(isl), np.asarray(weight, dtype=float)


def prefill_s(steps, lay, prompt_tokens: int, cached_tokens: float = 0.0) -> float:
    """Prefill time (s) of a prompt of ``prompt_tokens`` tokens whose first ``cached_tokens`` are
    in the cache, from a step-time source ``steps`` (:class:`optimizer.model.steptimes.StepTimes`):
    the whole-prompt pass without a hit, else one chunk of the new tokens after the cached ones
    (no decodes in the step)."""
    c = float(cached_tokens)
    if c <= 0:
        return steps.prefill_s(lay, int(prompt_tokens))
    return steps.mixed_step_s(lay, float(prompt_tokens) - c, c, 0.0, 0.0, 1)


def weighted_quantile(values: np.ndarray, weight: np.ndarray, q: float) -> float:
    """The q-quantile of ``values`` under the weights (inverted CDF: the least value whose
    cumulative weight reaches q)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(np.asarray(weight, dtype=float)[order])
    i = int(np.searchsorted(cum, q - 1e-12))
    return float(np.asarray(values)[order][min(i, len(order) - 1)])
