"""The registry: every registered codec is declared whole and tested whole.

Every codec is declared in registry.py; this test enumerates the registry and fails when a
codec lacks one of the tests every codec must have, or when its declaration does not match its
layers (presets, releases, exporter, runtime, bench facts, CLI commands).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from codecport import registry
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
    assert NAMES == ["dac", "mimi", "neucodec", "snac", "xcodec2"]
    assert [c.name for c in registry.codecs()] == NAMES


@pytest.mark.parametrize("codec", NAMES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_codec_has_every_kind_of_test(codec, kind):
    path = TESTS / f"test_{codec}_{kind}.py"
    assert path.is_file(), f"codec {codec} is registered but has no tests/{path.name}"
    names = [n.name for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    prefix = KINDS[kind]
    assert names, f"{path.name} holds no test"
    if prefix:
        assert any(n.startswith(prefix) for n in names), f"{path.name} has no {' or '.join(prefix)}* test"


@pytest.mark.parametrize("codec", NAMES)
def test_the_declaration_matches_the_layers(codec):
    from codecport.bench.facts import BenchFacts
    from codecport.runtime.codec import Codec

    spec = registry.get(codec)
    config, model, weights = spec.module("config"), spec.module("model"), spec.module("weights")
    exporter = spec.module("export")
    assert spec.default_preset in spec.presets and set(config.RELEASES) <= set(spec.presets)
    assert all(isinstance(c, config.CONFIG) for c in spec.presets.values())
    assert callable(model.init_random) and issubclass(model.MODEL, object) and callable(weights.load)
    for fn in ("export", "describe", "probe"):
        assert callable(getattr(exporter, fn)), f"export/{codec}.py has no {fn}()"
    assert isinstance(spec.bench, BenchFacts)
    assert issubclass(spec.runtime, Codec) and spec.runtime.name == codec and spec.label == spec.runtime.label
    assert set(spec.runtime.streams) <= {"encoder", "decoder"}
    assert spec.smoke and spec.suffixes[:2] == (".npy", ".npz")
    assert spec.bench.fixed_mode in {m for _, m in spec.runtime.graphs.values()}
    assert spec.bench.demo_preset in spec.presets and spec.bench.web_preset in (None, *spec.presets)
    assert (spec.bench.web_preset is not None) == spec.web
    cmd = export_cli.commands[codec]
    params = {p.name for p in cmd.params}
    assert {o.dest for o in spec.export_options} <= params and {"preset", "length", "weights"} <= params
    assert sorted(next(p for p in cmd.params if p.name == "preset").type.choices) == sorted(spec.presets)


def test_nothing_outside_a_codecs_files_names_a_codec():
    """The CLI, bench, demo, builds, tokenizer and server ask the registry; only a codec's own
    files (and its declaration in registry.py) name it."""
    root = Path(importlib.import_module("codecport").__file__).parent
    own = {f"{layer}/{name}{suffix}" for name in NAMES for layer in ("models", "export", "runtime", "bench")
           for suffix in (".py", "_config.py", "_weights.py")}
    # Code-file formats name the codec whose codes they hold (runtime/codefile.py's table).
    allowed = own | {"registry.py", "runtime/codefile.py"}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                pytest.fail(f"{rel}:{node.lineno} names the codec {node.value!r}")


def test_unknown_codec_says_which_there_are():
    with pytest.raises(registry.CodecportError, match="codecport has dac, mimi, neucodec, snac, xcodec2"):
        registry.get("encodec")
