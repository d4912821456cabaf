"""Megatron sequence parallelism offered by the deployment (``deployment.layouts[i].sp``) and serving
(``serving.<role>.sp``) problems: an SP layout round-trips through the instance file, is timed as
the plain TP layout under ring collectives (ReduceScatter + AllGather = the ring AllReduce, eq.
6-9), prints as ``TP8 SP`` and gets the engine's flag or a launch note. Neither problem has an
activation term in its memory (a fixed ``reserve_gib_per_gpu``), so SP changes no figure of theirs.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml

from optimizer.launch import VLLM_SP_CONFIG, flag_list, sp_args
from optimizer.model.layout import Layout
from tests.conftest import INSTANCES, assert_one_line_error
from tests.serving_helpers import llama70b_raw, problem, write

QWEN = INSTANCES / "qwen32b_128k.yaml"
TP8, TP8_SP = Layout.tp(8), Layout(8, 1, 8, 1, 1, 1, True)


def _deployment(tmp_path, layouts, name="dep.yaml"):
    raw = yaml.safe_load(QWEN.read_text())
    raw["model"]["config"] = str(INSTANCES / "models" / "qwen3-32b.json")
    raw["deployment"].pop("tensor_parallel")
    raw["deployment"]["layouts"] = layouts
    f = tmp_path / name
    f.write_text(yaml.safe_dump(raw))
    return f


def test_sp_layout_round_trips_through_the_deployment_instance(tmp_path):
    from optimizer.deployment.schema import build_problem

    f = _deployment(tmp_path, [{"attention": {"tp": 8}, "sp": True}, {"attention": {"tp": 8}}])
    p = build_problem(yaml.safe_load(f.read_text()), f)
    assert p.layouts == (TP8_SP, TP8)
    assert [lay.label() for lay in p.layouts] == ["TP8 SP", "TP8"]
    assert p.layouts[0].as_dict()["sp"] is True and "sp" not in p.layouts[1].as_dict()


def test_sp_deployment_plan_is_timed_as_plain_tp_and_labelled(cli, tmp_path):
    runs = {}
    for key, lay in (("sp", {"attention": {"tp": 8}, "sp": True}), ("tp", {"attention": {"tp": 8}})):
        r = cli(_deployment(tmp_path, [lay], f"{key}.yaml"), "--format", "json", "--time-limit", "20")
        assert r.exit_code == 0, r.output
        runs[key] = json.loads(r.stdout)["plan"]
    sp, tp = runs["sp"], runs["tp"]
    assert {i["layout_label"] for i in sp["instances"]} == {"TP8 SP"}
    assert all(i["layout"]["sp"] is True for i in sp["instances"])
    assert sp["makespan_ms"] == tp["makespan_ms"]  # the ring step is the same
    assert [i["memory_gb_per_gpu"] for i in sp["instances"]] == [i["memory_gb_per_gpu"] for i in tp["instances"]]
    inst = sp["instances"][0]
    assert f"--compilation-config {VLLM_SP_CONFIG!r}" in inst["launch"]["vllm"]
    assert any("sglang 0.5.14 has no sequence-parallel flag" in n for n in inst["launch_notes"])
    r = cli(_deployment(tmp_path, [{"attention": {"tp": 8}, "sp": True}], "text.yaml"), "--time-limit", "20")
    assert "TP8 SP" in r.stdout


def test_sp_step_equals_the_ring_step(tmp_path):
    from optimizer.deployment.perf import PerfModel
    from optimizer.deployment.schema import build_problem
    from optimizer.model.prefill import prefill_s

    f = _deployment(tmp_path, [{"attention": {"tp": 8}}])
    pm = PerfModel(build_problem(yaml.safe_load(f.read_text()), f)).model
    for n in (1, 4, 64):
        pos = np.full(n, 131000)
        a, b = pm.step(TP8, pos), pm.step(TP8_SP, pos)
        assert b.total_s == pytest.approx(a.total_s, rel=1e-12) and b.allreduce_s == pytest.approx(a.allreduce_s, rel=1e-12)
    assert prefill_s(pm, TP8_SP, 8192) == pytest.approx(prefill_s(pm, TP8, 8192), rel=1e-12)
    assert pm.static_bytes_per_gpu(TP8_SP) == pm.static_bytes_per_gpu(TP8)  # no activation term: a fixed reserve


@pytest.mark.parametrize("layout, field", [
    ({"attention": {"tp": 1}, "sp": True}, "deployment.layouts[0].sp"),
    ({"attention": {"tp": 8}, "sp": "yes"}, "deployment.layouts[0].sp"),
])
def test_bad_deployment_sp_is_one_line_exit_2(cli, tmp_path, layout, field):
    assert_one_line_error(cli(_deployment(tmp_path, [layout])), field)


# ----------------------------------------------------------------------------- serving
def _llama(**roles) -> dict:
    raw = llama70b_raw(simulation={"enabled": False}, engine="both")
    raw["serving"].update(roles)
    return raw


def test_serving_sp_workers_are_labelled_and_timed_as_plain_tp():
    from optimizer.serving import solve_instance
    from optimizer.serving.perf import ServingModel

    plain = problem(_llama())
    sp = problem(_llama(decode={"sp": True}, aggregated={"sp": True}, prefill={"sp": True}))
    a = ServingModel(plain).workers()
    b = ServingModel(sp).workers()
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert y.layout == (Layout(**{**x.layout.__dict__, "sp": True}) if x.layout.attention_tp > 1 else x.layout)
        assert y.rate == pytest.approx(x.rate, rel=1e-9) and y.limit == x.limit
        assert y.label(sp).endswith(" SP on h100-sxm") == (x.layout.attention_tp > 1)
    d = solve_instance(sp).to_dict()
    rows = d["plan"]["rates"][0]["modes"]
    labels = {w["layout"] for m in rows.values() for w in m.get("workers", [])}
    assert labels and all(lab.endswith(" SP") for lab in labels if not lab.startswith("TP1"))
    base = solve_instance(plain).to_dict()["plan"]["rates"][0]["modes"]
    assert {k: v["gpus"] for k, v in rows.items()} == {k: v["gpus"] for k, v in base.items()}
    w = next(w for m in rows.values() for w in m["workers"] if w["layout"].endswith(" SP"))
    assert VLLM_SP_CONFIG in w["launch"]["vllm"].replace("'", "")
    assert any("sglang 0.5.14 has no sequence-parallel flag" in n for n in w["launch_notes"])


def test_sglang_sp_flag_from_0_5_23_for_qwen3_dense_only():
    have = flag_list("sglang", "0.5.23")
    assert sp_args("sglang", TP8_SP, "qwen3", have, "0.5.23") == (["--enable-layernorm-sp"], None)
    for model, lay, spec in (("llama", TP8_SP, False), ("qwen3", TP8_SP, True),
                             ("qwen3", Layout(4, 2, 4, 1, 1, 1, True), False)):
        args, note = sp_args("sglang", lay, model, have, "0.5.23", spec)
        assert args == [] and "Qwen3 dense models without DP attention" in note
    assert sp_args("vllm", TP8, "qwen3", flag_list("vllm", "0.24.0"), "0.24.0") == ([], None)


def test_fixed_serving_worker_with_sp(cli_any, tmp_path):
    raw = _llama()
    raw["serving"]["fixed"] = {"workers": [{"role": "aggregated", "count": 2, "tp": 4, "sp": True}]}
    r = cli_any("estimate", write(tmp_path, raw), "--format", "json")
    assert r.exit_code == 0, r.output
    assert "TP4 SP" in r.stdout
    bad = copy.deepcopy(raw)
    bad["serving"]["fixed"]["workers"][0].update(tp=1)
    assert_one_line_error(cli_any("estimate", write(tmp_path, bad, "bad.yaml")), "serving.fixed.workers[0].sp")


@pytest.mark.parametrize("change, field", [
    ({"decode": {"sp": True, "tp": [1]}}, "serving.decode.sp"),
    ({"prefill": {"sp": 1}}, "serving.prefill.sp"),
])
def test_bad_serving_sp_is_one_line_exit_2(cli, tmp_path, change, field):
    assert_one_line_error(cli(write(tmp_path, _llama(**change))), field)
