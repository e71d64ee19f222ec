"""The house rules, each computed from the code (imports read from the AST, function-local ones
included): layers import downwards only, no import circle anywhere, the registry and `Codes`
stay light, `--help` loads neither onnxruntime nor torch, and no module grows past 400 lines.
docs/architecture.md draws the same layers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "codecport"
# Layers from the bottom: a module may import its own layer's package and the layers below. The
# runtime and the torch models sit side by side and never import each other; the applications
# (tokenize, serve) never import the front ends (cli, bench) nor each other.
LAYERS = {
    # atomic raises errors' OutputError
    "codecport.errors": 0, "codecport.version": 0, "codecport.atomic": 0.5,
    "codecport.frontend": 0.5,  # every front end's one-line errors (click, errors)
    "codecport.runtime": 1, "codecport.models": 1,
    "codecport.export": 2,
    "codecport.registry": 3,
    "codecport.tokenize": 4, "codecport.serve": 4,
    "codecport.cli": 5, "codecport.bench": 5,
    "codecport": 6,  # the front door (`codecport.load`) and its demo
}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(path: Path, name: str, known: dict | None = None) -> list[tuple[str, int, bool]]:
    """(module imported, line, at module level) for every import in `path`, codecport's only
    (`known`: codecport's modules, found anew when not given); `from pkg import mod` counts as
    importing `pkg.mod` when that is a module."""
    known = known or modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            if t == "codecport" or t.startswith("codecport."):
                out.append((t, node.lineno, id(node) in top))
    return out


def layer(name: str) -> tuple[str, int]:
    key = max((k for k in LAYERS if name == k or name.startswith(k + ".")), key=len)
    return key, LAYERS[key]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {t for t, _, _ in imports(path, name, known)} for name, path in known.items()}


def test_imports_point_down():
    bad, known = [], modules()
    for name, path in known.items():
        home, rank = layer(name)
        for target, line, _ in imports(path, name, known):
            there, their_rank = layer(target)
            if their_rank > rank or (their_rank == rank and there != home):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} ({home}) imports {target} ({there})")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)


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
    with pytest.raises(AssertionError, match="codecport.a"):
        test_no_import_circle()


def test_the_registry_imports_no_layer_at_import_time():
    """Declarations are data: a layer is imported when it is asked for (CodecSpec.module)."""
    path = ROOT / "registry.py"
    top = {t for t, _, at_top in imports(path, "codecport.registry") if at_top}
    assert top == {"codecport.errors"}, top


def test_codes_do_not_import_the_registry():
    for name in ("codecport.runtime.codes", "codecport.runtime.codefile"):
        targets = {t for t, _, _ in imports(modules()[name], name)}
        assert "codecport.registry" not in targets and "codecport" not in targets, targets


def test_the_runtime_imports_no_torch():
    for name, path in modules().items():
        if layer(name)[0] == "codecport.runtime":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                            else [node.module or ""])
                    assert not any(m.split(".")[0] in ("torch", "onnx", "onnxsim") for m in mods), \
                        f"{path.name}:{node.lineno} imports {mods}"


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


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in [*ROOT.rglob("*.py"), *ROOT.rglob("*.mjs")]
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these (over {MAX_LINES} lines): {long}"
