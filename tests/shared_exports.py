"""The exports the test files share, each built once per run, by whichever worker asks first: a
file lock beside the run's temp folders makes the others wait, then reuse it. Each is keyed by
the source (a change to codecport's code builds it anew). `CODECPORT_TEST_CACHE=DIR` keeps them
across runs (a quick rerun reuses what the code has not changed).

Tests read these folders; a test that changes one works on a copy (`copy_folder`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_support import process
from filelock import FileLock

CODE = Path(__file__).resolve().parents[1] / "codecport"


def source_key() -> str:
    h = hashlib.sha256()
    for path in sorted(CODE.rglob("*.py")):
        h.update(path.relative_to(CODE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


# ONNX Runtime's kernels on one thread (codecport's `threads` option), for the codecs a test opens
# where the thread count is not what it checks: see `one_thread`.
ONE_THREAD = {"threads": "1"}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's kernels on one thread while inside (the count before is put back). The suite runs
    three workers on two cores: a second thread per worker wins no time there, and its spin-waits
    cost CPU (a torch encode of the released Mimi's 11 s took 2.4 CPU-s on one thread, 5 to 6 on
    two, and no less wall time). Same results: tolerances and exact codes hold either way."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "xavier_uniform_",
         "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_")


@contextlib.contextmanager
def skipped_init() -> Iterator[None]:
    """torch modules built inside keep their weights uninitialised (torch.nn.init's functions do
    nothing), for modules whose every weight is set next: a released size's init draws hundreds
    of millions of random numbers that would be overwritten."""
    from unittest import mock

    import torch

    with mock.patch.multiple(torch.nn.init, **{name: lambda tensor, *a, **k: tensor for name in INITS}):
        yield


@pytest.fixture(scope="module")
def torch_one_thread():
    """`one_thread` for a whole module (`pytestmark = pytest.mark.usefixtures(...)`)."""
    with one_thread():
        yield


def shared(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """Folder `name`, built by `build(folder)` the first time any worker of this run asks."""
    if os.environ.get("CODECPORT_TEST_CACHE"):
        base = Path(os.environ["CODECPORT_TEST_CACHE"])
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        base = tmp_path_factory.getbasetemp().parent  # the run's folder, above every worker's
    else:
        base = tmp_path_factory.getbasetemp()
    root = base / "shared-exports" / source_key()
    root.mkdir(parents=True, exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            with one_thread():
                build(folder)
            done.write_text("")
    return folder


def copy_folder(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def damaged_copy(folder: Path, dst: Path, graph: str, key: str, value: str) -> Path:
    """A copy of export `folder` at `dst` whose `graph` says `value` for metadata `key`, without
    its manifest (the graphs alone, checked against each other)."""
    import onnx

    bad = copy_folder(folder, dst)
    model = onnx.load(str(bad / f"{graph}.onnx"))
    for p in model.metadata_props:
        if p.key == key:
            p.value = value
    onnx.save(model, str(bad / f"{graph}.onnx"))
    (bad / "manifest.json").unlink()
    return bad


def cli_export(folder: Path, *args) -> None:
    """`codec-export ARGS --random-init -o folder` as a user runs it (a process of its own); what
    it printed is kept beside the folder (`cli_output`)."""
    proc = process("codec-export", *args, "--random-init", "-o", folder, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder.with_name(folder.name + ".stdout").write_text(proc.stdout)
    folder.with_name(folder.name + ".stderr").write_text(proc.stderr)


def cli_output(folder: Path) -> subprocess.CompletedProcess:
    """What `cli_export` printed making `folder`."""
    return subprocess.CompletedProcess(["codec-export"], 0,
                                       folder.with_name(folder.name + ".stdout").read_text(),
                                       folder.with_name(folder.name + ".stderr").read_text())


# ---- the shared folders ------------------------------------------------------------------------
TINY_LEN = 600  # samples of the tiny DAC's exact graphs (100 frames of hop 6)
TINY_CHUNK = 3000  # window of the tiny DAC's chunked graphs
MIMI_TINY_FRAMES = 40  # code frames of the tiny Mimi fixed graphs (24-sample frames)
MIMI_TINY_STEP = 2  # code frames per step of the tiny Mimi step graphs
SNAC_TINY_LEN = 720  # samples of the tiny SNAC window graphs: 120 frames, 64 kept a window
TINY_SLOTS = 3  # streams a call of the tiny Mimi and SNAC slot graphs
SMOKE_BATCH = 4  # rows of the smoke exports' batched encoders
RELEASED_MIMI_FRAMES = 25  # the released Mimi's fixed graphs: 2 s (48000 samples), 80 ms a frame


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory, tiny_dac):
    """The tiny DAC exported by the library (numpy quantizer)."""
    from codecport.codecs.dac.export import export_dac

    return shared(tmp_path_factory, "dac-tiny", lambda out: export_dac(
        tiny_dac, out, TINY_LEN, TINY_CHUNK, preset="tiny", weights="random-init seed 0",
        weights_sha256="none"))


@pytest.fixture(scope="session")
def tiny_mimi_export(tmp_path_factory, tiny_mimi):
    """The tiny Mimi's fixed-length and step graphs (numpy quantizer)."""
    from codecport.codecs.mimi.export import export_mimi

    return shared(tmp_path_factory, "mimi-tiny", lambda out: export_mimi(
        tiny_mimi, out, MIMI_TINY_FRAMES * tiny_mimi.cfg.frame_size, MIMI_TINY_STEP, preset="tiny",
        weights="random-init seed 0", weights_sha256="none", slots=TINY_SLOTS))


@pytest.fixture(scope="session")
def tiny_snac_export(tmp_path_factory, tiny_snac):
    from codecport.codecs.snac.export import export_snac

    return shared(tmp_path_factory, "snac-tiny", lambda out: export_snac(
        tiny_snac, out, SNAC_TINY_LEN, preset="tiny", weights="random-init seed 0", weights_sha256="none",
        slots=TINY_SLOTS))


class _Lazy(dict):
    """name -> folder, each built (or waited for) when first asked: a test of one codec does not
    wait while another worker exports the rest."""

    def __init__(self, builders: dict[str, Callable[[], Path]]):
        super().__init__()
        self.builders = builders

    def __missing__(self, name: str) -> Path:
        self[name] = self.builders[name]()
        return self[name]

    def __iter__(self):
        return iter(self.builders)

    def __len__(self) -> int:
        return len(self.builders)

    def keys(self):
        return self.builders.keys()

    def items(self):
        return [(name, self[name]) for name in self.builders]

    def values(self):
        return [self[name] for name in self.builders]


@pytest.fixture(scope="session")
def smoke_exports(tmp_path_factory) -> dict:
    """Every registered codec exported through the real `codec-export`, with its registration's
    small `smoke` arguments, batched encoders (`--batch 4`, for codecs that have them) and seeded
    random weights: name -> folder, each exported when first asked for."""
    from codecport import registry

    builders = {}
    for spec in registry.codecs():
        batch = ["--batch", SMOKE_BATCH] if spec.runtime.batchable else []
        builders[spec.name] = lambda s=spec, b=batch: shared(
            tmp_path_factory, f"smoke-{s.name}", lambda folder: cli_export(folder, s.name, *s.smoke, *b))
    return _Lazy(builders)


def qwen3tts_slots(tmp_path_factory) -> Path:
    """The tiny Qwen3-TTS tokenizer with slot graphs (`--len 240 --slots 4`), through
    `codec-export`, once a run: its export tests read the graphs and what the CLI said, its
    server tests serve it."""
    return shared(tmp_path_factory, "qwen3tts-slots", lambda folder: cli_export(
        folder, "qwen3tts", "--preset", "tiny", "--len", "240", "--slots", "4"))


@pytest.fixture(scope="session")
def released_mimi(tmp_path_factory) -> tuple[Path, Path]:
    """(moshi-format weights file, export folder) of the released Mimi config with seeded random
    weights: 2 s fixed graphs and one-frame step graphs. Shared by the preset export tests,
    Kyutai's Rust Mimi parity and the rustymimi bench."""
    def build(folder: Path) -> None:
        from safetensors.torch import save_file

        from codecport.codecs.mimi.export import export_mimi
        from codecport.codecs.mimi.model import PRESETS, MimiModel, init_random

        model = init_random(MimiModel(PRESETS["mimi"]), seed=3).eval()
        folder.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(folder / "mimi.safetensors"))
        export_mimi(model, folder / "onnx", RELEASED_MIMI_FRAMES * model.cfg.frame_size, 1, preset="mimi",
                    weights="random-init seed 3", weights_sha256="none")

    folder = shared(tmp_path_factory, "mimi-released", build)
    return folder / "mimi.safetensors", folder / "onnx"
