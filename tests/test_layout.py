"""The house rules, each computed from the code: layers import downwards only, no import circle
anywhere, the registry and `Codes` stay light, a codec's runtime and config never reach torch,
`--help` loads neither onnxruntime nor torch, every codec is one folder of the roles
docs/architecture.md lists, and no module grows past 400 lines. An arrow is an import statement
(function-local ones included) or a codec's role asked for at run time (`spec.module("role")`,
and the registry finding each codec's `spec`): docs/architecture.md draws the same layers."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from codecport import registry
from codecport.registry.spec import ROLES

ROOT = Path(__file__).resolve().parents[1] / "codecport"
DOC = ROOT.parent / "docs" / "architecture.md"
# Layers from the bottom: a module may import its own layer's package and the layers below. The
# runtime and the torch models sit side by side and never import each other; the applications
# (tokenize, serve) never import the front ends (cli, bench) nor each other.
LAYERS = {
    # atomic raises errors' OutputError
    "codecport.errors": 0, "codecport.version": 0, "codecport.atomic": 0.5,
    "codecport.cluster": 0.5,  # Ray as tokenize and serve share it (errors)
    "codecport.frontend": 0.5,  # every front end's one-line errors (click, errors)
    "codecport.codecs": 0,  # the codecs' packages (__init__: a docstring and a table, no import)
    "codecport.runtime": 1, "codecport.models": 1,
    "codecport.export": 2,
    "codecport.registry": 3,
    "codecport.tokenize": 4, "codecport.serve": 4,
    "codecport.cli": 5, "codecport.bench": 5,
    "codecport": 6,  # the front door (`codecport.load`) and its demo
}
# A codec's module sits in the layer of its role: its config beside the torch models (no torch,
# checked below), its runtime and codes file in the engine, its facts with the bench.
ROLE_HOME = {"spec": "codecport.registry", "config": "codecport.models", "model": "codecport.models",
             "weights": "codecport.models", "export": "codecport.export", "runtime": "codecport.runtime",
             "codesfile": "codecport.runtime", "facts": "codecport.bench"}
TORCH_FREE_ROLES = ("config", "runtime", "codesfile")
HEAVY = ("torch", "onnx", "onnxsim", "onnxscript", "safetensors", "transformers")
# The calls that import a module named at run time (`importlib.import_module`): each is an arrow
# to what it imports. A codec's role is asked for with a literal (`spec.module("runtime")`), read
# as an arrow from the caller.
DYNAMIC = {
    # CodecSpec.module(role) itself: the arrow is the caller's.
    "codecport.registry.spec": (),
    # Each built-in codec's declaration, found by listing codecport/codecs/.
    "codecport.registry": ("spec",),
    # The official neucodec and xcodec2 packages (not codecport's), imported offline.
    "codecport.codecs.neucodec.facts": (),
}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def codec_folders() -> dict[str, Path]:
    return {p.name: p for p in sorted((ROOT / "codecs").iterdir()) if (p / "__init__.py").is_file()}


def table(path: Path, name: str):
    """The literal a package's `__init__` assigns to `name` (its HELPERS, BUILT_ON), or None."""
    for node in tree(path).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def role(name: str) -> str | None:
    """The role of a module of a codec's folder (`codecport.codecs.<codec>.<module>`)."""
    parts = name.split(".")
    if len(parts) < 4:
        return None
    helpers = table(ROOT / "codecs" / parts[2] / "__init__.py", "HELPERS") or {}
    return parts[3] if parts[3] in ROLES else helpers.get(parts[3])


def layer(name: str) -> tuple[str, float]:
    if name.startswith("codecport.codecs.") and name.count(".") >= 3:
        r = role(name)
        if r is None:
            raise AssertionError(f"{name} has no role: name it by role or list it in its codec's HELPERS")
        home = ROLE_HOME[r]
        return home, LAYERS[home]
    key = max((k for k in LAYERS if name == k or name.startswith(k + ".")), key=len)
    return key, LAYERS[key]


def arrows(path: Path, name: str) -> list[tuple[str, int, bool]]:
    """(module, line, at module level) of every arrow out of `path` into codecport: its imports
    (`from pkg import mod` counts as importing `pkg.mod` when that is a module), each role a
    `.module("role")` call asks for (as `codecport.codecs.*.<role>`), and what DYNAMIC says a
    run-time import reaches."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    body = tree(path)
    top = set(map(id, body.body))
    for node in ast.walk(body):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            arg = node.args[0] if node.args else None
            literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            if node.func.attr == "module" and literal:
                if arg.value not in ROLES:
                    raise AssertionError(f"{path.relative_to(ROOT.parent)}:{node.lineno} asks for "
                                         f"{arg.value!r}, which is no role ({', '.join(ROLES)})")
                targets = [f"codecport.codecs.*.{arg.value}"]
            elif node.func.attr == "import_module":
                if name not in DYNAMIC:
                    raise AssertionError(f"{path.relative_to(ROOT.parent)}:{node.lineno} imports a module "
                                         "named at run time: ask for a role with a literal, or list it in "
                                         "DYNAMIC")
                targets = [f"codecport.codecs.*.{r}" for r in DYNAMIC[name]]
        for t in targets:
            if t == "codecport" or t.startswith("codecport."):
                out.append((t, node.lineno, id(node) in top))
    return out


def target_layer(target: str) -> tuple[str, float]:
    if target.startswith("codecport.codecs.*."):
        home = ROLE_HOME[target.rpartition(".")[2]]
        return home, LAYERS[home]
    return layer(target)


def graph() -> dict[str, set[str]]:
    return {name: {t for t, _, _ in arrows(path, name)} for name, path in modules().items()}


def test_imports_point_down():
    bad = []
    for name, path in modules().items():
        home, rank = layer(name)
        for target, line, _ in arrows(path, name):
            there, their_rank = target_layer(target)
            if their_rank > rank or (their_rank == rank and there != home):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} ({home}) imports {target} ({there})")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)


def test_a_role_asked_for_at_run_time_is_an_arrow(monkeypatch, tmp_path):
    """The registry asking for a codec's facts (the bench's layer) points up, though no import
    statement says so: the check above must fail on it."""
    pkg = tmp_path / "codecport"
    (pkg / "registry").mkdir(parents=True)
    for f in ("__init__.py", "registry/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "registry" / "spec.py").write_text("def facts(spec):\n    return spec.module('facts').FACTS\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    modules.cache_clear()
    try:
        with pytest.raises(AssertionError, match=r"registry/spec.py:2 .* imports codecport.codecs.\*.facts"):
            test_imports_point_down()
    finally:
        modules.cache_clear()


def test_no_import_circle():
    """Tarjan's strongly connected components of the import graph: every one a single module."""
    edges, index, low, stack, on, circles = graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                circles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_circle_finder_finds_a_circle(monkeypatch, tmp_path):
    """The check above could pass by finding nothing: two modules that import each other fail."""
    pkg = tmp_path / "codecport"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from .a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    modules.cache_clear()
    try:
        with pytest.raises(AssertionError, match="codecport.a"):
            test_no_import_circle()
    finally:
        modules.cache_clear()


def test_the_registry_imports_no_layer_at_import_time():
    """Declarations are data: a codec's role is imported when it is asked for (CodecSpec.module)."""
    top = {t for name in ("codecport.registry", "codecport.registry.spec")
           for t, _, at_top in arrows(modules()[name], name) if at_top}
    assert top <= {"codecport.errors", "codecport.registry.spec"}, top


def test_the_registry_asks_a_codec_for_its_runtime_and_config_only():
    """The registry (what `codecport.load` and the applications open folders with) and the engine
    open a folder with the codec's runtime and read its presets and codes formats; its model,
    weights and facts are the front ends' (and the exporter the export machinery's, its layer)."""
    homes = ("codecport.registry", "codecport.runtime", "codecport.models")
    asked = {(name, t.rpartition(".")[2]) for name, path in modules().items() if layer(name)[0] in homes
             for t, _, _ in arrows(path, name) if t.startswith("codecport.codecs.*.")}
    assert {r for _, r in asked} <= {"runtime", "config", "codesfile", "spec"}, sorted(asked)


def test_codes_do_not_import_the_registry():
    for name in ("codecport.runtime.codes", "codecport.runtime.codefile"):
        targets = {t for t, _, _ in arrows(modules()[name], name)}
        assert not any(t.startswith("codecport.registry") for t in targets) and "codecport" not in targets, \
            targets


def closure(start: str) -> set[str]:
    """Every codecport module that importing `start` and calling it may load: its arrows,
    transitively, and the packages above each (their `__init__` runs first: its module-level
    imports)."""
    known, seen, todo = modules(), set(), [(start, False)]
    while todo:
        m, top_only = todo.pop()
        if (m, top_only) in seen or (m, False) in seen or m not in known:
            continue
        seen.add((m, top_only))
        parts = m.split(".")
        todo += [(".".join(parts[:i]), True) for i in range(1, len(parts))]
        todo += [(t, False) for t, _, at_top in arrows(known[m], m)
                 if not t.startswith("codecport.codecs.*.") and (at_top or not top_only)]
    return {m for m, _ in seen}


def heavy_imports(name: str) -> list[str]:
    out = []
    for node in ast.walk(tree(modules()[name])):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [] if node.level else [node.module or ""]
            out += [f"{name}:{node.lineno} imports {m}" for m in mods if m.split(".")[0] in HEAVY]
    return out


def test_the_runtime_and_every_codec_config_reach_no_torch():
    """The engine, and each codec's runtime, codes file and config with all they import, load
    neither torch nor onnx nor the export side: `pip install codecport` runs them."""
    starts = [n for n in modules() if layer(n)[0] == "codecport.runtime" or role(n) in TORCH_FREE_ROLES]
    assert any(role(n) == "config" for n in starts) and any(role(n) == "runtime" for n in starts)
    bad = []
    for start in starts:
        for m in sorted(closure(start)):
            bad += [f"{start} -> {b}" for b in heavy_imports(m)]
            if layer(m)[0] == "codecport.export":
                bad.append(f"{start} -> {m} (the export side)")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_torch_free_check_sees_through_imports(monkeypatch, tmp_path):
    """A config importing a helper that imports torch fails the check above."""
    pkg = tmp_path / "codecport"
    (pkg / "codecs" / "toy").mkdir(parents=True)
    (pkg / "runtime").mkdir()
    for f in ("__init__.py", "codecs/__init__.py", "codecs/toy/__init__.py", "runtime/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "runtime" / "codec.py").write_text("")
    (pkg / "codecs" / "toy" / "runtime.py").write_text("from ...runtime import codec\n")
    (pkg / "codecs" / "toy" / "config.py").write_text("from . import model\n")
    (pkg / "codecs" / "toy" / "model.py").write_text("import torch\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    modules.cache_clear()
    try:
        want = r"codecport.codecs.toy.config -> codecport.codecs.toy.model:1 imports torch"
        with pytest.raises(AssertionError, match=want):
            test_the_runtime_and_every_codec_config_reach_no_torch()
    finally:
        modules.cache_clear()


def doc_roles() -> dict[str, str]:
    """The roles docs/architecture.md's "Adding a codec" table lists: file -> role."""
    section = DOC.read_text().split("## Adding a codec", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(1)[:-3] for m in re.finditer(r"^\| `([a-z_]+\.py)` \|", section, re.M)}


def test_every_codec_is_one_folder_of_the_documented_roles():
    documented = doc_roles()
    assert set(documented.values()) == set(ROLES), (sorted(documented.values()), ROLES)
    folders = codec_folders()
    builtin = {s.name: s for s in registry.codecs() if s.package.startswith("codecport.")}
    assert set(builtin) == set(folders), (sorted(builtin), sorted(folders))
    for name, folder in folders.items():
        spec = builtin[name]
        assert spec.package == f"codecport.codecs.{name}", spec.package
        files = {p.stem for p in folder.glob("*.py")} - {"__init__"}
        helpers = table(folder / "__init__.py", "HELPERS") or {}
        want = set(ROLES) - ({"codesfile"} if not spec.codes_file else set())
        assert want <= files, f"{name} lacks {sorted(want - files)}"
        assert not set(helpers) & set(ROLES), f"{name}: a role is not a helper"
        undeclared, missing = sorted(files - set(ROLES) - set(helpers)), sorted(set(helpers) - files)
        assert not undeclared and not missing, \
            f"{name}: HELPERS lacks {undeclared}, lists missing {missing}"
        assert set(helpers.values()) <= set(ROLES) - {"spec"}, helpers
        imports = [n for n in ast.walk(tree(folder / "__init__.py"))
                   if isinstance(n, (ast.Import, ast.ImportFrom))
                   and getattr(n, "module", "") != "__future__"]
        assert not imports, \
            f"{name}/__init__.py imports: it runs whenever any of the codec's modules is imported"


def test_a_codec_imports_another_only_where_it_is_built_on_it():
    bad = []
    for name, path in modules().items():
        if not name.startswith("codecport.codecs.") or name.count(".") < 3:
            continue
        codec = name.split(".")[2]
        built_on = table(ROOT / "codecs" / codec / "__init__.py", "BUILT_ON") or ()
        for target, line, _ in arrows(path, name):
            parts = target.split(".")
            if target.startswith("codecport.codecs.") and len(parts) > 2 \
                    and parts[2] not in (codec, "*", *built_on):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}")
    assert not bad, "a codec built on another names it in its BUILT_ON:\n" + "\n".join(bad)


def test_no_engine_module_is_named_after_a_codec():
    """A codec's code is in its folder; no engine or application module carries its name (nor
    names it, tests/test_registry.py checks)."""
    bad = [f"{name}: named after {c}" for name, path in modules().items()
           if not name.startswith("codecport.codecs") for c in registry.names() if c in path.stem]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("command", [
    ["codecport.cli", "run_cli", "--help"], ["codecport.cli", "export_cli", "--help"],
    ["codecport.cli", "export_cli", "dac", "--help"], ["codecport.cli", "run_cli", "encode", "--help"],
    ["codecport.cli", "run_cli", "tokenize", "--help"]])
def test_help_loads_neither_onnxruntime_nor_torch(command):
    module, group, *args = command
    code = (f"import sys\nfrom {module} import {group}\n"
            f"try:\n    {group}.main({args!r}, prog_name='x')\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('onnxruntime', 'torch', 'onnx') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True)
    assert "Usage:" in proc.stdout and proc.stdout.strip().endswith("LOADED []"), proc.stdout[-500:]


def code_lines(path: Path) -> int:
    """Lines of code in a file: a page's inline scripts count, its markup does not."""
    text = path.read_text()
    if path.suffix == ".html":
        return sum(len(s.splitlines()) for s in re.findall(r"<script[^>]*>(.*?)</script>", text, re.S))
    return len(text.splitlines())


def test_no_module_is_over_400_lines():
    files = [*ROOT.rglob("*.py"), *ROOT.rglob("*.mjs"), *ROOT.rglob("*.html")]
    assert any(p.suffix == ".html" and code_lines(p) > 100 for p in files)  # the demo page's script is read
    long = {str(p.relative_to(ROOT)): n for p in files if (n := code_lines(p)) > MAX_LINES}
    assert not long, f"split these (over {MAX_LINES} lines): {long}"
