"""Every codec the CLI exports has a parity test, and the CLI's variant lists match the presets."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from codecport.cli import DAC_VARIANTS, MIMI_VARIANTS, export_cli

TESTS = Path(__file__).parent
# Export commands that export a codec (those with a reference model), not tools like `check`.
CODECS = sorted(c for c in export_cli.commands if importlib.util.find_spec(f"codecport.models.{c}"))


def test_the_codecs_are_found():
    assert CODECS == ["dac", "mimi"]


@pytest.mark.parametrize("codec", CODECS)
def test_every_exported_codec_has_a_parity_test(codec):
    path = TESTS / f"test_{codec}_model.py"
    assert path.is_file(), f"codec-export {codec} has no tests/test_{codec}_model.py"
    names = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
    assert any(n.startswith("test_transformers_parity") for n in names), \
        f"{path.name} has no test_transformers_parity* test"


@pytest.mark.parametrize(("codec", "variants"), [("dac", DAC_VARIANTS), ("mimi", MIMI_VARIANTS)])
def test_cli_variants_are_the_presets(codec, variants):
    presets = importlib.import_module(f"codecport.models.{codec}").PRESETS
    assert sorted(variants) == sorted(presets)
    assert codec in export_cli.commands
