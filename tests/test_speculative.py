"""Speculative decoding (issue #27 item 4): tokens per step, the verify + draft step of the one
performance model, memory, the serving model and simulator, bad input and launch flags."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from optimizer.errors import InputError
from optimizer.model.config import read_hf_config
from optimizer.model.hardware import hardware_from_catalog
from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel
from optimizer.model.speculative import (Speculative, expected_tokens_per_step, launch_flags, resolve,
                                         speculative_steps)
from optimizer.model.steptimes import AnalyticSteps, Calibration, CalibratedSteps
from tests.serving_helpers import INSTANCES, llama8b_raw, problem

V3 = INSTANCES / "models" / "deepseek-v3.json"


@pytest.fixture(scope="module")
def v3():
    spec = read_hf_config(V3)
    hw = hardware_from_catalog("h200-sxm", "hgx-h200")
    return spec, PerfModel(spec, hw, 1.0, 2.0, 0.0, weight_dtype="fp8", kv_dtype="bf16")


def test_tokens_per_step_is_leviathan_eq_1():
    """``(1 - a^(k+1))/(1 - a)``: k = 1 at a = 0.8 is 1 + 0.8; k = 3 at a = 0.5 is 1 + .5 + .25 + .125;
    every draft accepted (a = 1) gives k + 1; no draft gives 1."""
    assert expected_tokens_per_step(1, 0.8) == pytest.approx(1.8, abs=1e-12)
    assert expected_tokens_per_step(3, 0.5) == pytest.approx(1.875, abs=1e-12)
    assert expected_tokens_per_step(4, 1.0) == 5.0
    assert expected_tokens_per_step(0, 0.7) == pytest.approx(1.0)
    assert Speculative("mtp", 1, 0.8).tokens_per_step == pytest.approx(1.8)


def test_config_reads_the_mtp_layers(v3):
    """DeepSeek-V3's config.json has ``num_nextn_predict_layers: 1``; Llama has none."""
    spec, _ = v3
    assert spec.mtp_layers == 1 and spec.layers == 61
    assert read_hf_config(INSTANCES / "models" / "llama-3.1-8b.json").mtp_layers == 0


def test_mtp_weights_are_one_moe_layer_plus_eh_proj(v3):
    """The MTP module's parameters (DeepSeek-V3 sec. 2.2), by hand from the config: MLA
    ``q_a 7168·1536 + q_b 1536·128·192 + kv_a 7168·576 + kv_b 512·128·256 + o 128·128·7168``
    = 187,105,280; 256 routed + 1 shared expert ``3·7168·2048`` each; router ``256·7168 + 256``;
    ``eh_proj 2·7168²``. Held per GPU at TP8 (FP8 matrices 1 B, router and norms 2 B; the
    embedding and head are the main model's): ``(q_b + kv_b + o + shared + eh_proj)/8 +
    routed/8 + q_a + kv_a + router·2 + norms·2``. The main model is DeepSeek-V3's 671 B."""
    spec, pm = v3
    sp = resolve("mtp", 1, 0.8, spec, None)
    st = speculative_steps(AnalyticSteps(pm), sp, pm)
    attn_split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    attn_repl = 7168 * 1536 + 7168 * 576
    expert = 3 * 7168 * 2048
    router = 256 * 7168 + 256
    norms = 2 * 7168 + 1536 + 512 + 7168  # two layer norms, the latent norms, the final norm
    eh = 2 * 7168 * 7168
    held = (attn_split + expert + eh) / 8 + 256 * expert / 8 + attn_repl + 2 * (router + norms)
    assert st.draft_static_bytes_per_gpu(Layout.tp(8)) == pytest.approx(held, rel=1e-12)
    layer_params = attn_split + attn_repl + 257 * expert + router
    assert layer_params + eh == pytest.approx(11.6e9, rel=0.01)
    assert pm.w.params == pytest.approx(671e9, rel=0.01)


def test_golden_v3_mtp_k1_step(v3):
    """DeepSeek-V3 FP8 (KV bf16) on 8 x H200 (HBM 4.8 TB/s, NVLink 450 GB/s, α 0.822 us), TP8 with
    experts split like attention, B = 4 decodes at position 4096 (``decode_context`` 4097), MTP
    k = 1 at a = 0.8 (1.8 tokens per step). Step = verify + one MTP pass, each the roofline
    ``max(HBM, FLOP) + AllReduces`` (eq. 6-2, 6-9); HBM-bound here (FLOP checked below):

    * verify, ``B·(k+1) = 8`` query tokens: weights read ``sharded/8 + replicated +
      58·A(8)·expert/8`` with ``sharded = 61·attn_split + 3·3·7168·18432 + 58·expert(shared) +
      58·router·2 + head 129280·7168``, ``replicated = 61·(q_a + kv_a)``, ``A(b) =
      256·(1-(1-8/256)^b)`` (eq. 6-8); KV read once per sequence plus the drafted slot:
      ``61·576·2 B · 4·(4097+1)``; ``61 + 3 + 58 = 122`` ring AllReduces of ``8·7168·2`` B;
    * MTP pass, 4 tokens: ``(attn_split + shared + router·2 + head + eh_proj 2·7168²)/8 + q_a + kv_a
      + A(4)·expert/8`` and ``576·2 B · 4·4097`` of its own KV; 2 AllReduces of ``4·7168·2`` B.
    """
    spec, pm = v3
    hbm, alpha, bw = 4800e9, 0.822e-6, 450e9
    attn_split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    attn_repl = 7168 * 1536 + 7168 * 576
    expert = 3 * 7168 * 2048
    router_b = 2 * (256 * 7168 + 256)
    head = 129280 * 7168
    kv_tok = 576 * 2  # bytes per token per layer

    def active(b):
        return 256 * (1 - (1 - 8 / 256) ** b)

    def ring(m):
        return 2 * 7 * alpha + 2 * 7 * m / (8 * bw)

    sharded = 61 * attn_split + 3 * 3 * 7168 * 18432 + 58 * expert + 58 * router_b + head
    verify_bytes = sharded / 8 + 61 * attn_repl + 58 * active(8) * expert / 8 + 61 * kv_tok * 4 * 4098
    verify = verify_bytes / hbm + 122 * ring(8 * 7168 * 2)
    mtp_bytes = ((attn_split + expert + router_b + head + 2 * 7168 ** 2) / 8 + attn_repl + active(4) * expert / 8
                 + kv_tok * 4 * 4097)
    mtp = mtp_bytes / hbm + 2 * ring(4 * 7168 * 2)
    # FLOP of the verify step per GPU at the FP8 / BF16 peaks is far below its HBM time
    flop = 8 * 2 * 37e9 / 8 / 1978.9e12 + 61 * 128 * (4 * 512 + 2 * 64) * 4 * (2 * 4097 + 1) / 8 / 989.4e12
    assert flop < verify_bytes / hbm / 5
    sp = resolve("mtp", 1, 0.8, spec, None)
    st = speculative_steps(AnalyticSteps(pm), sp, pm)
    lay = Layout.tp(8)
    assert st.draft_s(lay, 0.0, 0.0, 4, 4097) == pytest.approx(mtp, rel=1e-9)
    step = st.mixed_step_s(lay, 0.0, 0.0, 4, 4097)
    assert step == pytest.approx(verify + mtp, rel=1e-9)
    assert step * 1e3 == pytest.approx(6.21, abs=0.005)  # verify 6.11 ms + MTP 0.10 ms
    assert step / sp.tokens_per_step * 1e3 == pytest.approx(3.45, abs=0.005)  # TPOT
    # plain decoding reads A(4) = 30 experts per layer, the verify A(8) = 56.6: 4.29 ms, slower per token
    plain = AnalyticSteps(pm).mixed_step_s(lay, 0.0, 0.0, 4, 4097)
    assert plain * 1e3 == pytest.approx(4.29, abs=0.005) and step / 1.8 < plain


def test_no_acceptance_is_slower_than_no_speculation(v3):
    """At acceptance → 0 a step emits one token but pays the verify of k+1 tokens and k draft
    passes: TPOT is above plain decoding at every batch; at a = 0.8 it is below at small batches."""
    spec, pm = v3
    lay = Layout.tp(8)
    base = AnalyticSteps(pm)
    for k in (1, 3):
        sp = resolve("mtp", k, 1e-6, spec, None)
        st = speculative_steps(base, sp, pm)
        for b in (1, 16, 256):
            plain = base.mixed_step_s(lay, 0.0, 0.0, b, 4097)
            assert st.mixed_step_s(lay, 0.0, 0.0, b, 4097) / sp.tokens_per_step > plain * 1.01
    good = speculative_steps(base, resolve("mtp", 1, 0.8, spec, None), pm)
    assert good.mixed_step_s(lay, 0.0, 0.0, 1, 4097) / 1.8 < base.mixed_step_s(lay, 0.0, 0.0, 1, 4097)


def test_memory_counts_the_draft_weights_kv_and_slots(v3):
    """Fewer requests fit: the MTP layer's weights and KV and k more KV slots per request. By hand:
    ``(memory - static - mtp weights) // (61·1152·(ctx+new+k) + 1152·(ctx+new))``."""
    spec, pm = v3
    lay = Layout.tp(8)
    base = AnalyticSteps(pm)
    st = speculative_steps(base, resolve("mtp", 2, 0.8, spec, None), pm)
    room = pm.hw.gpu.memory_bytes - pm.static_bytes_per_gpu(lay) - st.draft_static_bytes_per_gpu(lay)
    n = int(room // (61 * 1152 * (4096 + 1024 + 2) + 1152 * (4096 + 1024)))
    assert st.max_sessions(lay, 4096, 1024) == n < base.max_sessions(lay, 4096, 1024)


class _Stub:
    """A measured-like source that records what it is asked."""

    name = "measured"
    why = "stub"

    def __init__(self):
        self.calls = []

    def mixed_step_s(self, lay, chunk, c0, batch, ctx, ranks=1, draft_tokens=0):
        self.calls.append((batch, draft_tokens))
        return 1e-3 * (1 + draft_tokens)

    def prefill_s(self, lay, n, q=1):
        return 0.1

    def max_sessions(self, lay, context, new):
        return 100_000 // (context + new)  # a KV cache of 100,000 tokens


def test_other_sources_get_the_draft_tokens_and_keep_their_memory_rule(v3):
    """The verify step asks the base source with ``draft_tokens = k`` (the measured source then
    times ``batch·(k+1)`` decodes); a calibration passes it on; the measured memory rule takes
    the draft's weights and KV out of the base's KV-token capacity."""
    spec, pm = v3
    stub = _Stub()
    st = speculative_steps(stub, resolve("mtp", 2, 0.8, spec, None), pm)
    lay = Layout.tp(8)
    st.mixed_step_s(lay, 0.0, 0.0, 4, 100)
    assert stub.calls == [(4, 2)]
    cal = CalibratedSteps(stub, Calibration(decode=2.0, base="measured"))
    assert cal.mixed_step_s(lay, 0.0, 0.0, 4, 100, 1, 2) == pytest.approx(2 * 3e-3)
    per_tok = pm.kv_bytes_per_gpu(lay, 1, 0)
    left = 100_000 - st.draft_static_bytes_per_gpu(lay) / per_tok
    per_req = 1000 + 2 + st.draft.kv_bytes_per_gpu(lay, 1000, 0) / per_tok
    assert st.max_sessions(lay, 1000, 0) == max(0, int(left // per_req))
    assert st.name == "measured" and "speculative mtp k=2" in st.why


# ----------------------------------------------------------------------------- serving
def _v3_raw(rate: float, spec: dict | None = None, simulate: bool = False) -> dict:
    raw = {
        "name": "v3 decode-bound",
        "model": {"config": "models/deepseek-v3.json", "hf_id": "deepseek-ai/DeepSeek-V3", "weight_dtype": "fp8",
                  "kv_dtype": "bf16"},
        "hardware": {"gpu": "h200-sxm", "server": "hgx-h200", "servers": 8},
        "performance": {"source": "chapter"},
        "serving": {"traffic": {"rate_rps": rate, "isl": 1024, "osl": 1024}, "slo": {"ttft_ms": 3000, "tpot_ms": 25},
                    "mode": "disaggregated", "reserve_gib_per_gpu": 4,
                    "simulation": {"enabled": simulate, "requests": 300}},
    }
    if spec is not None:
        raw["serving"]["speculative"] = spec
    return raw


def _decode_gpus(raw):
    from optimizer.serving import ServingModel
    from optimizer.serving.solve import solve_mode
    from objectives.serving import registry

    p = problem(raw)
    sm = ServingModel(p)
    workers = sm.workers()
    res = solve_mode(p, workers, "disaggregated", registry()[p.objective], p.rates[0], 30.0)
    assert res.counts
    return p, workers, res, sum(workers[j].gpus * n for j, n in res.counts.items() if workers[j].role == "decode")


def test_serving_needs_fewer_decode_gpus_with_mtp():
    """A decode-bound DeepSeek-V3 instance (1K answers at 25 ms TPOT): MTP k = 1 at a = 0.8 lifts
    each decode worker's rate, so the plan needs fewer decode GPUs; TPOT = step / 1.8."""
    _, w0, _, plain = _decode_gpus(_v3_raw(40.0))
    p, w1, _, spec = _decode_gpus(_v3_raw(40.0, {"method": "mtp", "tokens": 1, "acceptance": 0.8}))
    assert spec < plain
    assert p.speculative.tokens_per_step == pytest.approx(1.8) and p.tokens_per_step == pytest.approx(1.8)
    best0 = max(w.rate for w in w0 if w.role == "decode")
    best1 = max(w.rate for w in w1 if w.role == "decode")
    assert best1 > 1.3 * best0


def test_simulator_draws_accepted_counts_and_meets_the_analytic_tpot():
    """The simulator draws each step's accepted count (seeded): a request of OSL 1024 needs about
    1023/1.8 steps, and the simulated TPOT of the plan is close to the analytic one."""
    from optimizer.serving.simulate import Req, draw_speculative_steps, simulate

    reqs = [Req(i, 0.0, 10, 1024) for i in range(400)]
    draw_speculative_steps(reqs, 1, 0.8, seed=3)
    steps = np.array([r.steps for r in reqs])
    assert steps.mean() == pytest.approx(1023 / 1.8, rel=0.01)
    assert steps.std() > 0  # counts vary between requests
    again = [Req(i, 0.0, 10, 1024) for i in range(400)]
    draw_speculative_steps(again, 1, 0.8, seed=3)
    assert [r.steps for r in again] == list(steps)
    p, workers, res, _ = _decode_gpus(_v3_raw(40.0, {"method": "mtp", "tokens": 1, "acceptance": 0.8}, True))
    from optimizer.serving import ServingModel

    sim = simulate(p, workers, res.counts, "disaggregated", p.rates[0], requests=300)
    (j, n), = [(j, n) for j, n in res.counts.items() if workers[j].role == "decode"]
    analytic = ServingModel(p).decode_figures(workers[j], p.rates[0] / n)["mean_tpot_s"]
    assert sim.tpot_s["mean"] < p.tpot_s
    assert sim.tpot_s["mean"] == pytest.approx(analytic, rel=0.15)
    assert sim.tpot_s["p99"] > sim.tpot_s["p50"]  # the drawn counts spread TPOT


@pytest.mark.parametrize("block,field,words", [
    ({"method": "mtp", "tokens": 0, "acceptance": 0.8}, "serving.speculative.tokens", "from 1 to 16"),
    ({"method": "mtp", "tokens": 1.5, "acceptance": 0.8}, "serving.speculative.tokens", "integer"),
    ({"method": "mtp", "tokens": 1, "acceptance": 1.2}, "serving.speculative.acceptance", "(0, 1]"),
    ({"method": "mtp", "tokens": 1, "acceptance": 0}, "serving.speculative.acceptance", "per-token"),
    ({"method": "mtp", "tokens": 1, "acceptance": -0.5}, "serving.speculative.acceptance", "(0, 1]"),
    ({"method": "medusa", "tokens": 1, "acceptance": 0.8}, "serving.speculative.method", "mtp, eagle, draft"),
    ({"method": "mtp", "tokens": 1, "acceptance": 0.8}, "serving.speculative.method", "has none"),
    ({"method": "draft", "tokens": 2, "acceptance": 0.7}, "serving.speculative.draft_config", "needs"),
    ({"method": "draft", "tokens": 2, "acceptance": 0.7, "draft_config": "models/qwen3-32b.json"},
     "serving.speculative.draft_config", "vocab_size"),
    ({"method": "draft", "tokens": 2, "acceptance": 0.7, "draft_config": "models/nope.json"},
     "serving.speculative.draft_config", "not"),
    ({"method": "mtp", "tokens": 1}, "serving.speculative.acceptance", ""),
])
def test_bad_input_is_one_line(block, field, words):
    """Each bad ``serving.speculative`` is one line naming the file and the field (Llama-3.1-8B
    has no MTP layers)."""
    raw = llama8b_raw(1.0, 512, 128, 1000, 50)
    raw["serving"]["speculative"] = block
    with pytest.raises(InputError) as e:
        problem(raw)
    line = str(e.value)
    assert "\n" not in line and field in line and words in line and "test.yaml" in line


def test_eagle_and_draft_models_resolve():
    """EAGLE defaults to one layer shaped like the target's; a draft model (Llama-3.1-8B for
    Llama-3.1-70B: same vocabulary) keeps its own embedding and head, so it holds more."""
    raw = copy.deepcopy(llama8b_raw(1.0, 512, 128, 1000, 50))
    raw["model"]["config"] = "models/llama-3.1-70b.json"
    raw["serving"]["speculative"] = {"method": "draft", "tokens": 3, "acceptance": 0.7,
                                     "draft_config": "models/llama-3.1-8b.json", "draft_hf_id": "meta-llama/Llama-3.1-8B"}
    p = problem(raw)
    assert p.speculative.draft.layers == 32 and p.speculative.tokens_per_step == pytest.approx(1 + .7 + .49 + .343)
    st = p.pools[0].steps
    assert st.draft.w.params == pytest.approx(8.0e9, rel=0.01)
    raw["serving"]["speculative"] = {"method": "eagle", "tokens": 2, "acceptance": 0.7}
    e = problem(raw).pools[0].steps
    assert e.draft.spec.layers == 1
    lay = Layout.tp(8)
    assert e.draft_static_bytes_per_gpu(lay) < st.draft_static_bytes_per_gpu(lay)


@pytest.mark.parametrize("method,engine,flags", [
    ("mtp", "vllm", ["--speculative-config", '{"method":"deepseek_mtp","num_speculative_tokens":1}']),
    ("mtp", "sglang", ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "1",
                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2"]),
    ("eagle", "vllm", ["--speculative-config", '{"method":"eagle","model":"yuhuili/EAGLE-X","num_speculative_tokens":1}']),
    ("eagle", "sglang", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "yuhuili/EAGLE-X",
                         "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
                         "--speculative-num-draft-tokens", "2"]),
    ("draft", "vllm", ["--speculative-config", '{"method":"draft_model","model":"yuhuili/EAGLE-X","num_speculative_tokens":1}']),
    ("draft", "sglang", ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "yuhuili/EAGLE-X",
                         "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
                         "--speculative-num-draft-tokens", "2"]),
])
def test_launch_flags(method, engine, flags):
    """vLLM ``--speculative-config`` JSON and SGLang ``--speculative-*`` flags (names of vLLM
    ``vllm/config/speculative.py`` and SGLang ``server_args.py``)."""
    sp = Speculative(method, 1, 0.8, draft_hf_id=None if method == "mtp" else "yuhuili/EAGLE-X", model_type="deepseek_v3")
    assert launch_flags(sp, engine) == flags


def test_launch_flags_generic_mtp_and_placeholder():
    assert launch_flags(Speculative("mtp", 3, 0.8, model_type="glm4_moe"), "vllm")[1] == \
        '{"method":"mtp","num_speculative_tokens":3}'
    assert "DRAFT_MODEL" in launch_flags(Speculative("eagle", 2, 0.8), "sglang")
    with pytest.raises(ValueError):
        launch_flags(Speculative("mtp", 1, 0.8), "trtllm")


def test_no_block_changes_nothing():
    """Without ``serving.speculative`` the problem has no speculative spec and E = 1."""
    p = problem(llama8b_raw(1.0, 512, 128, 1000, 50))
    assert p.speculative is None and p.tokens_per_step == 1.0
    assert not hasattr(p.pools[0].steps, "spec")
    assert math.isfinite(p.pools[0].steps.mixed_step_s(Layout.tp(1), 0.0, 0.0, 4, 600))


def test_the_decode_workers_launch_commands_carry_the_speculative_flags():
    """The plan's speculative block reaches the decode workers' commands (every flag in its
    version's list: launch checks it); prefill workers do not draft."""
    from optimizer.serving import ServingModel
    from optimizer.serving.launch import commands

    p = problem(_v3_raw(40.0, {"method": "mtp", "tokens": 1, "acceptance": 0.8}))
    ws = ServingModel(p).workers()
    dec = next(w for w in ws if w.role == "decode" and w.rate > 0)
    pre = next(w for w in ws if w.role == "prefill" and w.rate > 0)
    cmds = commands(p, dec)
    assert '"method":"deepseek_mtp"' in cmds["vllm"].replace(" ", "") and "--speculative-config" in cmds["vllm"]
    assert "--speculative-algorithm NEXTN" in cmds["sglang"] and "--speculative-num-draft-tokens 2" in cmds["sglang"]
    assert all("speculative" not in c for c in commands(p, pre).values())
