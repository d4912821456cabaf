"""Structure checks: constraint and objective families live in per-problem folders, and no
constraint or objective module imports the formulation that imports it (no import cycle)."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBLEM_FOLDERS = ("deployment", "experts", "buildout")


def _modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        yield path


@pytest.mark.parametrize("package", ["constraints", "objectives"])
def test_families_grouped_per_problem(package):
    flat = [p.name for p in (ROOT / package).glob("*.py") if p.name not in ("__init__.py", "base.py")]
    assert flat == [], f"{package}/ should hold only per-problem folders, found {flat}"
    for folder in PROBLEM_FOLDERS:
        assert (ROOT / package / folder / "__init__.py").exists()


@pytest.mark.parametrize("package", ["constraints", "objectives"])
def test_families_do_not_import_formulations(package):
    """A family module may import shared types (units, results, the builder), never a formulation
    or solve module of a problem, which imports the families back."""
    offenders = []
    for path in _modules(package):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                leaf = node.module.rsplit(".", 1)[-1]
                if node.module.startswith("optimizer.") and leaf in ("formulation", "solve", "model", "configurations"):
                    offenders.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert offenders == []


@pytest.mark.parametrize("module", [
    "constraints.deployment.fault", "constraints.deployment.deadline", "objectives.deployment.energy",
    "constraints.buildout.fabric", "constraints.experts.load", "objectives.experts.max_load",
])
def test_family_imports_first_in_fresh_interpreter(module):
    """Importing a family module first (before any formulation) works: no cycle to trip over."""
    out = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_units_module_is_importable_alone():
    units = importlib.import_module("optimizer.deployment.units")
    assert units.ticks_up(units.TIME_UNIT_S * 3) == 3
    assert units.ticks_down(units.TIME_UNIT_S * 3) == 3


def test_problem_registry_finds_every_problem_package():
    from optimizer.problems import registry

    assert {"deployment", "experts", "buildout"} <= set(registry())


def test_a_new_problem_plugs_in_without_editing_the_dispatcher(tmp_path, monkeypatch):
    """A package ``optimizer/<name>/`` with a ``spec.py`` is found and selected by its section."""
    import optimizer
    from optimizer import problems

    pkg = tmp_path / "toyproblem"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "class _Toy:\n"
        "    def load(self, raw, path, objective=None): return {'raw': raw, 'steps': ['load']}\n"
        "    def build(self, data): return None\n"
        "    def solve(self, data, budget, progress): data['steps'].append('solve'); return data\n"
        "    def evaluate(self, data, plan): return None\n"
        "    def explain(self, data, solution, budget): data['steps'].append('explain'); return 'why'\n"
        "    def report(self, data, solution, explanation): return (solution['steps'] + ['report'], explanation)\n"
        "PIPELINE = _Toy()\n")
    (pkg / "spec.py").write_text("from optimizer.problems import ProblemSpec\n"
                                 "SPEC = ProblemSpec(section='toy', package='optimizer.toyproblem', summary='a toy')\n")
    monkeypatch.setattr(optimizer, "__path__", list(optimizer.__path__) + [str(tmp_path)])
    problems.registry.cache_clear()
    try:
        spec = problems.problem_spec_for({"toy": {}}, Path("x.yaml"))
        assert spec.section == "toy"
        from optimizer.budget import Budget

        assert isinstance(spec.module().PIPELINE, problems.Pipeline)
        got = problems.run_problem(spec, {"toy": {}}, Path("x.yaml"), None, Budget.unlimited())
        assert got == (["load", "solve", "explain", "report"], "why")
        assert problems.problem_spec_for({"model": {}}, Path("x.yaml")).section == "deployment"
    finally:
        problems.registry.cache_clear()
        for name in ("optimizer.toyproblem", "optimizer.toyproblem.spec"):
            sys.modules.pop(name, None)


def test_objectives_are_objects_with_one_home():
    """Every deployment objective is one module declaring name, unit and definition; no module
    of the deployment, build-out, experts, supernode or serving problem outside objectives/
    compares objective names (each objective module carries its own behaviour)."""
    from objectives.deployment import registry

    objs = registry()
    assert {"cost", "dollars", "gpus", "makespan", "latency", "energy"} <= set(objs)
    for o in objs.values():
        assert o.unit and len(o.definition) > 20
    from objectives.buildout import registry as buildout
    from objectives.experts import registry as experts
    from objectives.serving import registry as serving
    from objectives.supernode import registry as supernode

    names = set(objs) | set(buildout()) | set(experts()) | set(supernode()) | set(serving())
    offenders = []
    for path in [f for pkg in ("deployment", "buildout", "experts", "supernode", "serving")
                 for f in (ROOT / "optimizer" / pkg).rglob("*.py")]:
        text = path.read_text()
        for name in names:
            for pat in (f'objective == "{name}"', f'objective != "{name}"', f"objective == '{name}'"):
                if pat in text:
                    offenders.append(f"{path.relative_to(ROOT)}: {pat}")
    assert offenders == []


def test_python_api_runs_any_problem():
    from optimizer import load_instance, run_instance
    from optimizer.errors import InputError

    r = run_instance(ROOT / "instances" / "hgx_h100_120kw.yaml")
    assert r.to_dict()["problem"] == "buildout" and r.to_dict()["objective"]["value"] == 88
    with pytest.raises(InputError, match="run_instance"):
        load_instance(ROOT / "instances" / "hgx_h100_120kw.yaml")


def test_a_serving_then_a_deployment_solve_in_one_process_share_the_highs_scheduler():
    """HiGHS keeps one thread scheduler per process, sized by the first solve, and fails a later
    solve asking for another size: the serving MILPs size it first here, and the deployment
    search after them must still reach its optimum (every instance comes from
    ``optimizer.highs.new_highs``, none resets the scheduler)."""
    from optimizer import run_instance
    from optimizer.highs import THREADS
    from optimizer.schema_base import read_yaml
    from optimizer.serving import PIPELINE

    path = ROOT / "instances" / "serving_llama70b_h100.yaml"
    milps = PIPELINE.build(PIPELINE.load(read_yaml(path), path))
    assert {m.h.getOptionValue("threads")[1] for m in milps.values()} == {THREADS}

    run_instance(path)
    d = run_instance(ROOT / "instances" / "qwen3_30b_a3b_batched.yaml").to_dict()
    assert d["status"] == "optimal" and abs(d["objective"]["value"] - 0.30443) < 1e-4


def test_commands_without_cp_sat_do_not_import_it():
    """The CLI lists every problem's objectives at start-up; that must not import OR-Tools
    (0.5-0.7 s with the pandas it pulls in): a serving solve and ``--help`` never use CP-SAT,
    and with a 1-2 s ``--time-limit`` that import alone broke the limit."""
    probe = ("import sys\nfrom optimizer import cli\nsys.argv = ['optimize'] + sys.argv[1:]\n"
             "try:\n    cli.run()\nexcept SystemExit:\n    pass\n"
             "print('ORTOOLS', any(m.startswith('ortools') for m in sys.modules), file=sys.stderr)\n")
    for args in (["--help"], [str(ROOT / "instances" / "serving_llama70b_h100.yaml"), "--format", "json",
                              "--time-limit", "5"]):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=ROOT)
        assert "ORTOOLS False" in out.stderr, (args, out.stderr[-500:])


def test_import_layer_contracts_hold():
    """The import-linter contracts of pyproject.toml (cli > problems > model > shared, the
    families import no solve code, no import cycles inside any package) are kept."""
    out = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                          "sys.exit(lint_imports())"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "0 broken" in out.stdout


def test_deployment_package_has_no_module_level_mutable_state():
    """No module of optimizer/deployment/ binds a module-level name to a list, dict or set, or
    rebinds a global: a solve's state lives in its SolveContext."""
    offenders = []
    for path in sorted((ROOT / "optimizer" / "deployment").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.List, ast.Dict, ast.Set,
                                                                                         ast.ListComp, ast.DictComp)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} global {', '.join(node.names)}")
    assert offenders == []


def test_two_solves_with_different_settings_back_to_back_are_independent():
    """Two solves in one process, the first with other settings and --progress, the second
    with the defaults: the second equals a solve of a fresh interpreter (no state carries over)."""
    from dataclasses import replace

    from optimizer.deployment import load, solve
    from optimizer.deployment.settings import SolverSettings

    inst = ROOT / "instances" / "qwen3_30b_a3b_batched.yaml"
    rows = []
    first = solve(load(inst), "makespan", time_limit_s=20, settings=replace(SolverSettings(), main_share=0.3),
                  progress=rows.append).to_dict()
    second = solve(load(inst), "cost", time_limit_s=20).to_dict()
    probe = ("import json; from optimizer.deployment import load, solve; "
             f"d = solve(load({str(inst)!r}), 'cost', time_limit_s=20).to_dict(); "
             "print(json.dumps([d['status'], d['objective']['value'], d['solver']['method']]))")
    fresh = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    import json

    assert json.loads(fresh.stdout) == [second["status"], second["objective"]["value"], second["solver"]["method"]]
    assert first["objective"]["name"] == "makespan" and rows and rows[-1]["method"].startswith("done")
    assert all(r["unit"] == "ms" for r in rows)


def test_every_deployment_result_names_the_plan_and_bound_methods(cli):
    """solver.method and solver.bound_method are in the JSON of an optimal, an infeasible and a
    faulted deployment; each names a registered method."""
    import json

    from optimizer.deployment import methods

    names = [m.name for m in methods.load(methods.MAIN + methods.AFTER)]
    for inst, extra in (("qwen32b_128k.yaml", []), ("qwen32b_128k_fault.yaml", []),
                        ("qwen32b_128k.yaml", ["--set", "workload.min_on_time_fraction=1",
                                                "--set", "workload.sessions.0.deadline_ms=1"])):
        res = cli(str(ROOT / "instances" / inst), "--format", "json", "--time-limit", "20", *extra)
        d = json.loads(res.stdout)
        s = d["solver"]
        assert "method" in s and "bound_method" in s
        if d["status"] == "infeasible":
            assert s["method"] is None and any(s["bound_method"].startswith(n) for n in names), s
        else:
            assert any(s["method"].startswith(n) for n in names), s
            assert any(s["bound_method"].startswith(n) for n in names), s
