"""A quoted number (``"50"``) is refused with one line naming the field, in every problem's
instance file alike: the deployment schema refused it while serving and the shared models
coerced it silently (a fresh user's finding). One numeric field per problem is quoted here."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error

REPO = Path(__file__).resolve().parents[1]

CASES = [
    ("qwen32b_128k.yaml", r"(\n  servers: )1\b", "hardware.servers"),
    ("qwen32b_128k.yaml", r"(\n      new_tokens: )8\b", "workload.sessions[0].new_tokens"),
    ("serving_llama70b_h100.yaml", r"(\n    tpot_ms: )50\b", "serving.slo.tpot_ms"),
    ("serving_llama70b_h100.yaml", r"(\n    ttft_ms: )1000\b", "serving.slo.ttft_ms"),
    ("qwen32b_128k.yaml", r"(\n  reserve_gib_per_gpu: )2\b", "deployment.reserve_gib_per_gpu"),
    ("hgx_h100_120kw.yaml", r"(\n  power_budget_kw: )120\b", "power_budget_kw"),
    ("supernode_deepseek_v3.yaml", r"(\n  slo_ms_per_token: )50\b", "supernode.slo_ms_per_token"),
    ("deepseek_v3_ep32.yaml", r"(\n  num_gpus: )32\b", "experts.num_gpus"),
]


@pytest.mark.parametrize("name,pattern,field", CASES, ids=[c[2] for c in CASES])
def test_quoted_number_is_refused(cli, tmp_path, name, pattern, field):
    src = (REPO / "instances" / name).read_text()
    text, n = re.subn(pattern, lambda m: m.group(0).replace(m.group(0)[len(m.group(1)):], f'"{m.group(0)[len(m.group(1)):]}"'), src, count=1)
    assert n == 1, "the instance no longer has the field this test quotes"
    for sub in ("models", "hardware", "traces"):
        if (REPO / "instances" / sub).is_dir():
            shutil.copytree(REPO / "instances" / sub, tmp_path / sub)
    p = tmp_path / name
    p.write_text(text)
    assert_one_line_error(cli(p), str(p), field)
