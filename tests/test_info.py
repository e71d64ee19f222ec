"""Reading a graph's facts without a session (runtime/onnxfile.py, `read_graph`) and
`codec-run info`, which checks every graph it lists that way: the metadata and shapes read from
the protobuf are what onnx and ONNX Runtime read, a damaged file is one error line, and a
damaged graph anywhere in a folder (not only its first) fails `info`."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from codecport import registry
from codecport.cli.run import run_cli
from codecport.errors import ModelFileError
from codecport.runtime import onnxfile
from codecport.runtime.graph import graph_files, open_graph, read_graph, read_metadata

NAMES = registry.names()


def damage(folder: Path, graph: str, key: str, value: str) -> None:
    """Graph `graph` of `folder` says `value` for metadata `key` (the manifest kept)."""
    path = folder / f"{graph}.onnx"
    model = onnx.load(str(path))
    entries = {p.key: p for p in model.metadata_props}
    entries[key].value = value
    onnx.save(model, str(path))


def info(*args) -> tuple[int, list[str]]:
    result = CliRunner().invoke(run_cli, ["info", *map(str, args)])
    return result.exit_code, result.output.strip().splitlines()


def _onnx_io(model: onnx.ModelProto) -> tuple[list, list]:
    """A graph's inputs (its weights left out, as ONNX Runtime leaves them) and outputs, with the
    shapes as a session declares them: a dimension's value, else its name, else None."""
    def shape(v):
        return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in v.type.tensor_type.shape.dim)

    weights = {w.name for w in model.graph.initializer}
    return ([(v.name, shape(v)) for v in model.graph.input if v.name not in weights],
            [(v.name, shape(v)) for v in model.graph.output])


@pytest.mark.parametrize("name", NAMES)
def test_the_protobuf_read_is_what_onnx_and_onnxruntime_read(smoke_exports, name):
    """Every graph of each codec's export: the metadata as `onnx.load` reads metadata_props, the
    inputs' and outputs' shapes as onnx reads the graph; the first graph's as an ONNX Runtime
    session declares them too (a session of every graph cost a minute of the suite)."""
    files = graph_files(smoke_exports[name])
    assert len(files) >= 2
    for i, f in enumerate(files):
        model = onnx.load(str(f), load_external_data=False)
        meta, (ins, outs) = onnxfile.read_onnx(f)
        assert meta == {p.key: p.value for p in model.metadata_props} and "codec" in meta, f
        assert (ins, outs) == _onnx_io(model), f
        if i == 0:
            opened = open_graph(f, "CPUExecutionProvider")
            assert ins == [(a.name, tuple(a.shape)) for a in opened.session.get_inputs()], f
            assert outs == [(a.name, tuple(a.shape)) for a in opened.session.get_outputs()], f
            assert read_graph(f).shapes() == opened.shapes()


def test_initializers_listed_as_inputs_are_not_inputs(tiny_mimi_export, tmp_path):
    """A graph that lists its weights among its inputs (IR < 4's way): ONNX Runtime leaves them
    out of its inputs, and so does the reader."""
    model = onnx.load(str(tiny_mimi_export / "decoder.onnx"))
    model.graph.input.extend(onnx.helper.make_tensor_value_info(w.name, w.data_type, list(w.dims))
                             for w in model.graph.initializer[:3])
    onnx.save(model, str(tmp_path / "decoder.onnx"))
    want = read_graph(tiny_mimi_export / "decoder.onnx").shapes()
    assert read_graph(tmp_path / "decoder.onnx").shapes() == want


def test_reading_metadata_opens_no_session(tiny_mimi_export, monkeypatch):
    """read_metadata, codec_of_folder and `codec-run info` on .onnx files build no session."""
    from codecport.runtime import graph

    def refuse(*args, **kwargs):
        raise AssertionError("a session was opened")

    monkeypatch.setattr(graph, "open_graph", refuse)
    monkeypatch.setattr(graph, "onnxruntime", refuse)
    assert read_metadata(tiny_mimi_export / "encoder_step.onnx")["codec"] == "mimi"
    assert registry.codec_of_folder(tiny_mimi_export).name == "mimi"
    code, lines = info(tiny_mimi_export)
    assert code == 0 and lines[0].startswith(f"{tiny_mimi_export}: mimi tiny"), lines
    assert len(lines) == 1 + len(graph_files(tiny_mimi_export))


@pytest.mark.parametrize("graph, key, value, says", [
    ("encoder", "frame_size", "abc", "frame_size='abc' is not an integer"),
    ("decoder_step", "samples", "49", "its inputs/outputs are"),
    ("encoder_slots_s2", "slots", "5", "holds 5 slots, its name says 2"),
    ("decoder_slots", "export_id", "0123456789abcdef", "does not belong with"),
    ("encoder_step", "role", "decoder", "has role decoder, expected encoder"),
])
def test_info_checks_every_graph_it_lists(tiny_mimi_export, tmp_path, graph, key, value, says):
    """One graph damaged, not the first one listed (decoder.onnx): `info` names it in one
    `error:` line and exits 1, as loading the folder and opening that graph would. It read the
    first graph's metadata alone, and exited 0."""
    folder = shutil.copytree(tiny_mimi_export, tmp_path / "model")
    damage(folder, graph, key, value)
    code, lines = info(folder)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {folder / graph}.onnx") and says in lines[0], lines


def test_info_on_a_folder_without_its_manifest(tiny_mimi_export, tmp_path):
    """A folder of graphs alone (an older export's, or copied without it) is read from its first
    graph, and each graph is checked against the others."""
    folder = shutil.copytree(tiny_mimi_export, tmp_path / "model")
    (folder / "manifest.json").unlink()
    code, lines = info(folder)
    assert code == 0 and lines[0].startswith(f"{folder}: mimi tiny"), lines
    damage(folder, "encoder", "sample_rate", "16000")
    code, lines = info(folder)
    assert code == 1 and "does not belong with" in lines[-1] and "sample_rate" in lines[-1], lines


def _file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "encoder.onnx"
    path.write_bytes(data)
    return path


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    def varint(n: int) -> bytes:
        out = b""
        while n >= 0x80:
            out += bytes([n & 0x7F | 0x80])
            n >>= 7
        return out + bytes([n])

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _entry(key: str, value: bytes) -> bytes:
    return _field(14, _field(1, key.encode()) + _field(2, value))


@pytest.mark.parametrize("cut", [1, 7, 0.5, -1])
def test_a_truncated_graph_is_one_error(tiny_mimi_export, tmp_path, cut):
    data = (tiny_mimi_export / "encoder.onnx").read_bytes()
    end = int(len(data) * cut) if isinstance(cut, float) else cut % len(data)
    with pytest.raises(ModelFileError, match="not a loadable model .*truncated.*; re-run codec-export"):
        read_metadata(_file(tmp_path, data[:end]))


@pytest.mark.parametrize("data, says", [
    (b"\x0f" * 64, "wire type 7"),
    (b"\xff" * 64, "a varint of more than 10 bytes"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "a field of 73 bytes at byte 2 runs past byte 16"),
    (_field(14, b"\x0a\xff\xff\xff\xff\x0f"), "runs past"),  # a key of 4 GiB declared, 0 bytes there
    (_entry("codec", b"\xff\xfe"), "not UTF-8"),
    (_entry("codec", b"mimi") + b"\x0f", "wire type 7"),
    (bytes(1 << 20), "a field numbered 0 at byte 0"),  # a preallocated download: zeros, refused at once
])
def test_a_file_that_is_not_an_onnx_protobuf_is_one_error(tmp_path, data, says):
    with pytest.raises(ModelFileError, match="not a loadable model") as e:
        read_graph(_file(tmp_path, data))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_metadata_past_the_bound_is_refused(tmp_path, monkeypatch):
    """The strings kept are bounded (MAX_FACTS): a file declaring more is refused, not read."""
    monkeypatch.setattr(onnxfile, "MAX_FACTS", 1000)
    small = _file(tmp_path, _entry("codec", b"mimi") + _entry("note", b"x" * 900))
    assert read_metadata(small) == {"codec": "mimi", "note": "x" * 900}
    with pytest.raises(ModelFileError, match="pass 1000 bytes"):
        read_metadata(_file(tmp_path, _entry("codec", b"mimi") + _entry("note", b"x" * 1000)))


def test_a_graph_without_codecport_metadata_or_with_free_dimensions(tmp_path):
    with pytest.raises(ModelFileError, match="has no codecport metadata"):
        read_metadata(_file(tmp_path, _entry("author", b"someone")))
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = onnx.helper.make_model(graph)
    onnx.helper.set_model_props(model, {"codec": "mimi"})
    onnx.save(model, str(tmp_path / "free.onnx"))
    assert read_metadata(tmp_path / "free.onnx") == {"codec": "mimi"}
    with pytest.raises(ModelFileError, match=r"x has the shape \('batch', 4\), not a static one"):
        read_graph(tmp_path / "free.onnx")
