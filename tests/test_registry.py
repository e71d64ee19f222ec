"""The registry: every registered codec is declared whole and tested whole.

A codec is registered by its runtime module; this test enumerates the registry and fails when a
codec lacks one of the tests every codec must have, or when its declaration does not match its
layers (presets, releases, exporter, bench hooks, CLI commands).
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
    assert NAMES == ["dac", "mimi", "snac"]
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
    spec = registry.get(codec)
    config, model, weights = spec.module("config"), spec.module("model"), spec.module("weights")
    exporter, bench = spec.module("export"), spec.module("bench")
    assert spec.default_variant in spec.presets and set(config.RELEASES) <= set(spec.presets)
    assert all(isinstance(c, config.CONFIG) for c in spec.presets.values())
    assert callable(model.init_random) and issubclass(model.MODEL, object) and callable(weights.load)
    for hook in ("export", "describe", "hooks"):
        assert callable(getattr(exporter, hook)), f"export/{codec}.py has no {hook}()"
    for hook in ("clip_samples", "export_options", "skip", "torch_encode", "torch_codes", "torch_decode",
                 "transformers_model", "long_frames", "long_fields", "stream_bench", "demo_stream"):
        assert callable(getattr(bench, hook)), f"bench/{codec}.py has no {hook}()"
    assert spec.runtime.spec is spec and spec.runtime.name == codec
    assert spec.smoke and spec.suffixes[:2] == (".npy", ".npz")
    assert bench.MODE in {m for _, m in spec.runtime.graphs.values()} and isinstance(bench.NOISE, dict)
    cmd = export_cli.commands[codec]
    params = {p.name for p in cmd.params}
    assert {o.dest for o in spec.export_options} <= params and {"variant", "length", "weights"} <= params
    assert sorted(next(p for p in cmd.params if p.name == "variant").type.choices) == sorted(spec.presets)


def test_nothing_outside_a_codecs_files_names_a_codec():
    """The CLI, bench, demo and variants ask the registry; only a codec's own files name it."""
    root = Path(importlib.import_module("codecport").__file__).parent
    shared = [root / "cli.py", root / "demo.py", root / "registry.py", root / "export" / "variants.py",
              root / "bench" / "cli.py", root / "bench" / "worker.py", root / "runtime" / "codec.py",
              root / "runtime" / "codes.py", root / "runtime" / "folder.py"]
    for path in shared:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                pytest.fail(f"{path.relative_to(root)}:{node.lineno} names the codec {node.value!r}")


def test_no_import_cycle_between_export_modules():
    """export/variants.py reaches the codecs through the registry, never by importing them."""
    for name in ("variants", "graph", "deviation"):
        tree = ast.parse(Path(importlib.import_module(f"codecport.export.{name}").__file__).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & set(NAMES), f"export/{name}.py imports {imported & set(NAMES)}"


def test_unknown_codec_says_which_there_are():
    with pytest.raises(registry.CodecportError, match="codecport has dac, mimi, snac"):
        registry.get("encodec")
