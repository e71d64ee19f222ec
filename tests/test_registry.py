"""The registry: every registered codec is declared whole and tested whole.

Every codec declares itself in its folder's spec.py; this test enumerates the registry and
fails when a codec lacks one of the tests every codec must have, or when its declaration does
not match its modules (presets, releases, exporter, runtime, bench facts, CLI commands).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from codecport import registry
from codecport.bench.facts import facts_of
from codecport.cli import export_cli

TESTS = Path(__file__).parent
NAMES = registry.names()
# Test files every codec has, and a test each must hold (a name prefix, or any test).
KINDS = {
    # numbers against an independent reference: transformers' port, or the official package
    "model": ("test_transformers_parity", "test_official_parity"),
    "export": None,
    "runtime": None,
    "cli": None,
    "bad_input": None,
}


def test_the_codecs_are_found():
    assert NAMES == ["dac", "mimi", "neucodec", "qwen3tts", "snac", "xcodec2"]
    assert [c.name for c in registry.codecs()] == NAMES


def asserts(fn: ast.FunctionDef) -> bool:
    """Whether a test states something that could be false: an assert, pytest.raises, a numpy
    testing call, or a call of a helper whose name says it checks (`check_...`, `assert_...`)."""
    for n in ast.walk(fn):
        if isinstance(n, ast.Assert):
            return True
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name == "raises" or name.startswith(("assert_", "check_")):
                return True
    return False


def names_codec(tree: ast.Module, codec: str) -> bool:
    """Whether a test file is about `codec`: it names it in a string (a fixture's key, a preset,
    `registry.get`), or imports its package."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and codec in n.value.split():
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
            if any(m.startswith(f"codecport.codecs.{codec}") for m in mods):
                return True
    return False


@pytest.mark.parametrize("codec", NAMES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_codec_has_every_kind_of_test(codec, kind):
    """Each file is the codec's (it names it or imports its package), each of its tests asserts
    something, and the model's holds a parity test of that name."""
    path = TESTS / f"test_{codec}_{kind}.py"
    assert path.is_file(), f"codec {codec} is registered but has no tests/{path.name}"
    tree = ast.parse(path.read_text())
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert tests, f"{path.name} holds no test"
    assert names_codec(tree, codec), f"{path.name} never names {codec}: whose tests are these?"
    idle = [t.name for t in tests if not asserts(t)]
    assert not idle, f"{path.name}: these tests assert nothing: {idle}"
    prefix = KINDS[kind]
    if prefix:
        assert any(t.name.startswith(prefix) for t in tests), \
            f"{path.name} has no {' or '.join(prefix)}* test"


def test_the_test_checks_can_fail():
    """A test without an assertion, and a file about another codec, are caught."""
    idle = ast.parse("def test_x():\n    y = 1\n").body[0]
    checks = ast.parse("def test_x():\n    check_close(1, 2)\n").body[0]
    assert not asserts(idle) and asserts(checks)
    assert names_codec(ast.parse("x = registry.get('snac')"), "snac")
    assert not names_codec(ast.parse("x = registry.get('snac')"), "dac")


@pytest.mark.parametrize("codec", NAMES)
def test_the_declaration_matches_the_layers(codec):
    from codecport.bench.facts import BenchFacts
    from codecport.runtime.codec import Codec

    spec = registry.get(codec)
    config, model, weights = spec.module("config"), spec.module("model"), spec.module("weights")
    exporter = spec.module("export")
    assert spec.default_preset in spec.presets and set(config.RELEASES) <= set(spec.presets)
    assert all(isinstance(c, config.CONFIG) for c in spec.presets.values())
    import inspect

    import torch

    assert issubclass(model.MODEL, torch.nn.Module), model.MODEL
    assert list(inspect.signature(model.init_random).parameters)[:2] == ["model", "seed"]
    assert {"weights", "preset", "revision"} <= set(inspect.signature(weights.load).parameters)
    for fn, args in (("export", ["model", "out_dir", "length"]), ("describe", ["report"]),
                     ("probe", ["manifest"])):
        params = list(inspect.signature(getattr(exporter, fn)).parameters)
        assert params[:len(args)] == args, f"codecs/{codec}/export.py: {fn}{params}"
    assert isinstance(facts_of(spec), BenchFacts)
    assert issubclass(spec.runtime, Codec) and spec.runtime.name == codec and spec.label == spec.runtime.label
    assert set(spec.runtime.streams) <= {"encoder", "decoder"}
    assert spec.smoke and spec.suffixes[:2] == (".npy", ".npz")
    assert facts_of(spec).fixed_mode in {m for _, m in spec.runtime.graphs.values()}
    assert facts_of(spec).demo_preset in spec.presets and facts_of(spec).web_preset in (None, *spec.presets)
    assert (facts_of(spec).web_preset is not None) == spec.web
    cmd = export_cli.commands[codec]
    params = {p.name for p in cmd.params}
    assert {o.dest for o in spec.export_options} <= params and {"preset", "length", "weights"} <= params
    assert sorted(next(p for p in cmd.params if p.name == "preset").type.choices) == sorted(spec.presets)


def test_nothing_outside_a_codecs_folder_names_a_codec():
    """The engine, the CLI, bench, demo, builds, tokenizer and server ask the registry; only a
    codec's own folder names it."""
    root = Path(importlib.import_module("codecport").__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("codecs/"):
            continue
        found += [f"{rel}:{n.lineno} names the codec {n.value!r}"
                  for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.Constant) and n.value in NAMES]
    assert not found, "\n".join(found)


def test_no_test_file_imports_from_conftest(tmp_path):
    """Helpers live in plain modules (support.py, shared_exports.py, ...): once a sub-folder has a
    conftest.py of its own, pytest replaces `conftest` in sys.modules before loading each, and
    `from conftest import` gets whichever it loaded last."""
    def imports_conftest(path: Path) -> bool:
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module == "conftest":
                return True
            if isinstance(n, ast.Import) and any(a.name == "conftest" for a in n.names):
                return True
        return False

    (tmp_path / "t.py").write_text("from conftest import noise\n")
    assert imports_conftest(tmp_path / "t.py")  # the check finds one
    bad = sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py") if imports_conftest(p))
    assert not bad, bad


def test_unknown_codec_says_which_there_are():
    with pytest.raises(registry.CodecportError,
                       match="codecport has dac, mimi, neucodec, qwen3tts, snac, xcodec2"):
        registry.get("encodec")
