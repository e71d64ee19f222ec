"""Folders of ORT-format `.ort` graphs (the mobile target) run like folders of `.onnx` graphs."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
from shared_exports import TINY_LEN
from support import noise

from codecport.codecs.dac.runtime import DacCodec
from codecport.codecs.mimi.runtime import MimiCodec
from codecport.errors import ModelFileError
from codecport.runtime.graph import read_metadata


def _to_ort(src, dst):
    """`src` copied to `dst` and converted with ORT's own tool; returns the .onnx files it had."""
    shutil.copytree(src, dst)
    subprocess.run([sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(dst)],
                   check=True, capture_output=True, timeout=300)
    return sorted(dst.glob("*.onnx"))


@pytest.fixture(scope="module")
def dac_ort(tmp_path_factory, tiny_export):
    dst = tmp_path_factory.mktemp("dac_ort") / "m"
    both = _to_ort(tiny_export, dst)
    assert both and all(p.with_suffix(".ort").is_file() for p in both)
    assert DacCodec(dst).files["encoder"].suffix == ".onnx"  # .onnx preferred where both exist
    for p in both:
        p.unlink()
    return dst


@pytest.fixture(scope="module")
def mimi_ort(tmp_path_factory, tiny_mimi_export):
    dst = tmp_path_factory.mktemp("mimi_ort") / "m"
    for p in _to_ort(tiny_mimi_export, dst):
        p.unlink()
    return dst


@pytest.mark.parametrize("folder", ["tiny_export", "tiny_mimi_export"])
def test_metadata_survives_conversion(request, tmp_path, folder):
    src = request.getfixturevalue(folder)
    files = _to_ort(src, tmp_path / "m")
    assert [p.name for p in files] == sorted(p.name for p in src.glob("*.onnx")) != []
    for onnx_file in files:
        assert read_metadata(onnx_file.with_suffix(".ort")) == read_metadata(onnx_file)


def test_dac_from_ort_files(tiny_export, dac_ort):
    ref, ort_codec = DacCodec(tiny_export), DacCodec(dac_ort)
    assert {p.suffix for p in ort_codec.files.values()} == {".ort"}
    assert ort_codec.present == ref.present
    sr = ref.sample_rate
    for n in (TINY_LEN, 5 * TINY_LEN + 17):  # the exact graph, then the chunked ones
        audio = noise(n, seed=n)
        want, got = ref.encode(audio, sr), ort_codec.encode(audio, sr)
        np.testing.assert_array_equal(got.data, want.data)
        np.testing.assert_allclose(ort_codec.decode(got)[0], ref.decode(want)[0], atol=1e-5)


def test_mimi_from_ort_files(tiny_mimi_export, mimi_ort):
    ref, ort_codec = MimiCodec(tiny_mimi_export), MimiCodec(mimi_ort)
    assert {p.suffix for p in ort_codec.files.values()} == {".ort"}
    assert ort_codec.present == ref.present
    for n, mode in ((500, "fixed"), (3000, "step")):
        audio = noise(n, seed=n)
        want = ref.encode(audio, 24000, mode=mode).data
        got = ort_codec.encode(audio, 24000, mode=mode).data
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(ort_codec.decode(got, mode=mode)[0],
                                   ref.decode(want, mode=mode)[0], atol=1e-5)


def test_missing_graph_names_both_formats(tmp_path, mimi_ort):
    folder = tmp_path / "m"
    shutil.copytree(mimi_ort, folder)
    (folder / "encoder_step.ort").unlink()
    with pytest.raises(ModelFileError, match=r"encoder_step\.onnx \(or encoder_step\.ort\)"):
        MimiCodec(folder).graph("encoder_step")
