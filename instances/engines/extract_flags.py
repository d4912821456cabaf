"""Write ``instances/engines/<engine>-<version>.yaml``: every command-line flag an engine release's
argument parser registers, read from the release's wheel (its source files, by ``ast``; nothing is
imported or run).

Usage: ``python instances/engines/extract_flags.py WHEEL [WHEEL ...]`` (``pip download --no-deps
vllm==0.24.0`` / ``sglang==0.5.14`` gives the wheel). Where a release's flags come from:

* vLLM: ``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``: one ``add_argument("--flag", ...)``
  per engine option) and ``vllm/entrypoints/openai/cli_args.py`` (``common/`` from 0.33) (``vllm serve``'s frontend options,
  one flag per field of ``BaseFrontendArgs`` / ``FrontendArgs``, ``--field-name``).
* SGLang: ``sglang/srt/server_args.py`` and ``sglang/srt/arg_groups/fields/*.py`` (``ServerArgs``
  fields annotated ``A[type, "help"]`` or ``A[type, Arg(...)]`` become ``--field-name`` or the
  ``Arg``'s ``cli_name``, plus its ``aliases``; ``no_cli=True`` fields have none;
  ``sglang/srt/arg_groups/arg_utils.py`` ``add_cli_args_from_dataclass``), plus the explicit
  ``add_argument("--flag", ...)`` calls of ``ServerArgs.add_cli_args``.
* Environment variables the launch commands set: checked by name in ``vllm/envs.py`` /
  ``sglang/srt/environ.py``.
"""
from __future__ import annotations

import ast
import hashlib
import re
import sys
import zipfile
from pathlib import Path

FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*(\.[a-z_]+)?$")
ENV = {"vllm": ("vllm/envs.py", ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")),
       "sglang": ("sglang/srt/environ.py", ("SGLANG_ENABLE_CP_V2",))}


def _add_argument_flags(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and FLAG.match(a.value):
                    out.add(a.value)
    return out


def _field_flags(tree: ast.AST, classes: tuple[str, ...] | None, annotated_only: bool) -> set[str]:
    out = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if classes is not None and cls.name not in classes:
            continue
        for st in cls.body:
            if not isinstance(st, ast.AnnAssign) or not isinstance(st.target, ast.Name):
                continue
            name = st.target.id
            if name.startswith("_"):
                continue
            ann = st.annotation
            if not annotated_only:
                out.add("--" + name.replace("_", "-"))
                continue
            if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"):
                continue
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            meta = parts[1] if len(parts) > 1 else None
            names = ["--" + name.replace("_", "-")]
            if isinstance(meta, ast.Call):
                kw = {k.arg: k.value for k in meta.keywords}
                if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
                    continue
                if isinstance(kw.get("cli_name"), ast.Constant):
                    names = [kw["cli_name"].value]
                if isinstance(kw.get("aliases"), ast.List):
                    names += [e.value for e in kw["aliases"].elts if isinstance(e, ast.Constant)]
            elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
                continue
            out.update(n for n in names if n.startswith("--"))
    return out


def extract(wheel: Path) -> tuple[str, str, list[str], list[str], list[str]]:
    engine, version = wheel.name.split("-")[:2]
    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    read = lambda n: ast.parse(z.read(n).decode())  # noqa: E731
    if engine == "vllm":
        cli = next(n for n in ("vllm/entrypoints/openai/cli_args.py", "vllm/entrypoints/common/cli_args.py") if n in names)
        files = ["vllm/engine/arg_utils.py", cli]
        flags = _add_argument_flags(read(files[0])) | _add_argument_flags(read(files[1]))
        flags |= _field_flags(read(files[1]), ("BaseFrontendArgs", "FrontendArgs"), annotated_only=False)
    else:
        fields = sorted(n for n in names if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py"))
        files = ["sglang/srt/server_args.py"] + fields
        flags = _add_argument_flags(read(files[0])) | _field_flags(read(files[0]), None, annotated_only=True)
        for f in fields:
            flags |= _field_flags(read(f), None, annotated_only=True)
    env_file, wanted = ENV[engine]
    env_text = z.read(env_file).decode() if env_file in names else ""
    env = [e for e in wanted if e in env_text]
    return engine, version, sorted(flags), env, files


def main(argv: list[str]) -> None:
    here = Path(__file__).parent
    for w in map(Path, argv):
        engine, version, flags, env, files = extract(w)
        sha = hashlib.sha256(w.read_bytes()).hexdigest()
        text = (f"# {engine} {version}: every flag its argument parser registers (instances/engines/extract_flags.py)\n"
                f"engine: {engine}\nversion: {version}\n"
                f"source: \"{w.name} (PyPI wheel, sha256 {sha}): {', '.join(files)}\"\n"
                f"env: [{', '.join(env)}]\nflags:\n" + "".join(f"  - \"{f}\"\n" for f in flags))
        (here / f"{engine}-{version}.yaml").write_text(text)
        print(f"{engine} {version}: {len(flags)} flags, env {env}")


if __name__ == "__main__":
    main(sys.argv[1:])
