"""Prefix reuse (issue #27 item 3): a shared prefix found in the cache is read, not recomputed."""
from __future__ import annotations

import numpy as np
import pytest

import optimizer.serving as serving
from optimizer.errors import InputError
from optimizer.model.prefill import chunk_attention_pairs, forward_pass
from optimizer.model.prefix import PrefixReuse, prefill_s
from optimizer.serving.perf import ServingModel
from optimizer.serving.simulate import arrivals
from tests.serving_helpers import llama70b_raw, problem


def _raw(mode="disaggregated", prefix=(1024, 0.9), rate=20, **serving_kw):
    traffic = {"rate_rps": rate, "isl": 4096, "osl": 128}
    if prefix is not None:
        traffic.update(prefix_tokens=prefix[0], cache_hit_rate=prefix[1])
    return llama70b_raw(mode=mode, traffic=traffic, simulation={"requests": 1500}, **serving_kw)


def test_prefill_work_per_request_drops_by_the_reused_share():
    """4,096-token prompts, a 1,024-token shared prefix at a 90 % hit rate: 0.9 x 1,024 = 921.6 tokens
    reused per request on average, so 3,174.4 computed (22.5 % less); the aggregated chunk share at a
    given rate (λ·E[computed tokens]/(C·dp)) and the simulated prompt tokens drop by the same share."""
    with_p, without = ServingModel(problem(_raw("aggregated"))), ServingModel(problem(_raw("aggregated", None)))
    assert with_p.mean_new == pytest.approx(3174.4)
    assert without.mean_new == pytest.approx(4096.0)
    assert 1 - with_p.mean_new / without.mean_new == pytest.approx(0.225)
    assert PrefixReuse(1024, 0.9).expected_new_tokens(4096) == pytest.approx(3174.4)
    # a prompt no longer than the prefix still computes its last token
    assert PrefixReuse(1024, 1.0).expected_new_tokens(512) == pytest.approx(1.0)
    p = problem(_raw("aggregated"))
    reqs = arrivals(p, 20.0, 4000, seed=3)
    computed = sum(r.isl - r.cached for r in reqs) / len(reqs)
    assert computed == pytest.approx(3174.4, rel=0.01)  # 4,000 draws: the hit share within about 0.5 %
    assert {r.cached for r in reqs} == {0, 1024}


def test_a_hit_is_one_chunk_of_the_new_tokens_after_the_cached_prefix():
    """Analytic source, Llama-3.1-70B TP4: a hit's prefill is the forward pass of 3,072 tokens with
    4,096 tokens of KV and 3,072·1,024 + 3,072·3,073/2 causal pairs (eq. 6-4/6-5 over the new
    positions); the miss is the whole prompt's pass. The hit is faster by more than the attention
    share and less than the token share (25 %)."""
    p = problem(_raw("aggregated"))
    sm = ServingModel(p)
    lay = next(w.layout for w in sm.workers(("aggregated",)) if w.layout.attention_tp == 4)
    steps, perf = p.pools[0].steps, p.pools[0].perf
    hit = prefill_s(steps, lay, 4096, 1024)
    by_hand = forward_pass(perf, lay, 3072.0, 4096.0, chunk_attention_pairs(3072, 1024), p.eff).total_s
    assert hit == pytest.approx(by_hand)
    assert chunk_attention_pairs(3072, 1024) == 3072 * 1024 + 3072 * 3073 / 2
    miss = prefill_s(steps, lay, 4096, 0)
    assert miss == pytest.approx(steps.prefill_s(lay, 4096))
    assert 0.75 * miss < hit < 0.95 * miss


def test_the_plan_needs_fewer_prefill_gpus_when_ttft_binds():
    """Disaggregated Llama-3.1-70B at 20 req/s of 4,096-token prompts, TTFT 1 s (prefill workers
    limited by TTFT): 16 prefill GPUs without reuse, 12 with a 1,024-token prefix at 90 % (measured;
    22 and 16 when each prefill worker was sized as its own queue), every plan checked by the simulation."""
    def prefill_gpus(d):
        m = d["plan"]["rates"][0]["modes"]["disaggregated"]
        assert m["simulated"]["attainment"] >= 0.9
        assert all(g["limited_by"] == "ttft" for g in m["workers"] if g["role"] == "prefill")
        return sum(g["gpus_per_worker"] * g["count"] for g in m["workers"] if g["role"] == "prefill")

    base = prefill_gpus(serving.solve_instance(problem(_raw(prefix=None))).to_dict())
    reuse = prefill_gpus(serving.solve_instance(problem(_raw())).to_dict())
    assert (base, reuse) == (16, 12)


def test_a_cached_prefix_is_not_sent_over_the_kv_link():
    """Disaggregated: the mean KV transfer per request drops by the reused share (the decode
    workers hold the shared prefix too)."""
    sm, base = ServingModel(problem(_raw())), ServingModel(problem(_raw(prefix=None)))
    w = next(w for w in sm.workers(("prefill",)) if w.rate > 0)
    w0 = next(x for x in base.workers(("prefill",)) if x.layout == w.layout)
    ratio = sm.prefill_figures(w, 0.0)["mean_transfer_s"] / base.prefill_figures(w0, 0.0)["mean_transfer_s"]
    assert ratio == pytest.approx(3174.4 / 4096, rel=1e-3)


@pytest.mark.parametrize("traffic,field", [({"prefix_tokens": 1024}, "serving.traffic.prefix_tokens"),
                                           ({"cache_hit_rate": 0.5}, "serving.traffic.cache_hit_rate"),
                                           ({"prefix_tokens": 1024, "cache_hit_rate": 1.5}, "cache_hit_rate"),
                                           ({"prefix_tokens": 0, "cache_hit_rate": 0.5}, "prefix_tokens")])
def test_bad_prefix_input_is_one_line_naming_the_field(traffic, field):
    raw = llama70b_raw(traffic={"rate_rps": 1, "isl": 2048, "osl": 128, **traffic})
    with pytest.raises(InputError) as e:
        problem(raw)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_no_prefix_keeps_every_figure():
    """Without prefix_tokens the prompt points are the traffic's own (the model unchanged)."""
    sm = ServingModel(problem(llama70b_raw()))
    assert np.array_equal(sm.pre_new, sm.p.traffic.isl) and not sm.pre_cached.any()
    assert sm.new_q == sm.isl_q and sm.mean_new == sm.mean_isl


def test_the_launch_commands_keep_the_prefix_cache_on():
    """vLLM gets --enable-prefix-caching (a flag of its version's list); SGLang's RadixAttention is on
    unless --disable-radix-cache, which is never printed."""
    from optimizer.serving.launch import commands

    p = problem(_raw())
    w = next(w for w in ServingModel(p).workers(("prefill",)) if w.rate > 0)
    cmds = commands(p, w)
    assert "--enable-prefix-caching" in cmds["vllm"].split()
    assert "--disable-radix-cache" not in cmds["sglang"]
    p0 = problem(_raw(prefix=None))
    assert "--enable-prefix-caching" not in commands(p0, w)["vllm"]


def test_a_trace_with_its_own_prefix_tokens_is_replayed_per_request(tmp_path):
    """A trace's prefix_tokens column: each request reuses its own prefix on a hit; the analytic
    model takes their mean; prefix_tokens in the instance as well is refused."""
    rows = ["arrival_s,input_tokens,output_tokens,prefix_tokens"]
    rows += [f"{i * 0.5:.3f},{2048 if i % 2 else 1024},64,{512 if i % 2 else 0}" for i in range(400)]
    f = tmp_path / "t.csv"
    f.write_text("\n".join(rows) + "\n")
    raw = llama70b_raw(traffic={"trace": str(f), "cache_hit_rate": 1.0})
    p = problem(raw)
    assert p.prefix.prefix_tokens == 256 and p.prefix.per_request
    reqs = arrivals(p, 2.0, 400, seed=1)
    assert [r.cached for r in reqs[:4]] == [0, 512, 0, 512]
    raw["serving"]["traffic"]["prefix_tokens"] = 100
    with pytest.raises(InputError, match="prefix_tokens column"):
        problem(raw)
    del raw["serving"]["traffic"]["prefix_tokens"], raw["serving"]["traffic"]["cache_hit_rate"]
    with pytest.raises(InputError, match="cache_hit_rate"):
        problem(raw)
