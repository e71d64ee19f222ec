"""Shared by the tokenize tests: a generated corpus, the CLI, and the reference codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import soundfile as sf

import codecport

RATES = (8000, 16000, 22050, 24000, 44100, 48000)
BIN = Path(sys.executable).parent


def make_corpus(root: Path, n: int, seed: int = 0, max_s: float = 1.2, short_every: int = 4) -> list[Path]:
    """`n` clips of mixed rates, channels, lengths and formats under `root` (two folders deep);
    every `short_every`-th clip is under 0.1 s, so that it fits the smoke exports' fixed graphs."""
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        sr, ch = RATES[i % len(RATES)], 1 + (i % 3 == 0)
        secs = rng.uniform(0.02, 0.09) if i % short_every == 0 else rng.uniform(0.15, max_s)
        t = np.arange(int(sr * secs)) / sr
        x = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 2000) * t)[:, None] + \
            0.05 * rng.standard_normal((len(t), ch))
        path = root / f"spk{i % 3}" / f"clip{i:03d}.{'flac' if i % 5 == 0 else 'wav'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, x.astype(np.float32), sr)
        files.append(path)
    return files


def add_bad_files(root: Path) -> dict[str, str]:
    """Corrupt, empty and truncated inputs; id -> a word their error must contain."""
    (root / "bad").mkdir(parents=True, exist_ok=True)
    (root / "bad" / "corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk")
    (root / "bad" / "empty.wav").write_bytes(b"")
    good = root / "bad" / "ok.wav"
    sf.write(good, np.zeros((16000, 1), np.float32) + 0.1, 16000)
    data = good.read_bytes()
    good.unlink()
    (root / "bad" / "truncated.wav").write_bytes(data[:40])
    return {"bad/corrupt.wav": "cannot read", "bad/empty.wav": "cannot read",
            "bad/truncated.wav": "cannot read"}


def tokenize(*args, check: bool = True, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "codec-run"), "tokenize", *map(str, args)], check=False,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, **kw)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def rows(out: Path) -> dict[str, dict]:
    """id -> row of a tokenize output, read with pyarrow.dataset; each id must come once."""
    table = pads.dataset(out, format="parquet").to_table()
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    return {r["id"]: r for r in table.to_pylist()}


def reference(folder: Path, files: dict[str, Path]) -> dict[str, np.ndarray]:
    """id -> the codes `codecport.load(folder).encode_file` gives, file by file (the first time
    scale; `reference_levels` has them all)."""
    return {ident: levels[0] for ident, levels in reference_levels(folder, files).items()}


def reference_levels(folder: Path, files: dict[str, Path]) -> dict[str, tuple[np.ndarray, ...]]:
    codec = codecport.load(folder)
    return {ident: codec.encode_file(path).arrays for ident, path in files.items()}


def assert_codes(got: dict[str, dict], want: dict) -> None:
    """Rows against `reference` (the first time scale) or `reference_levels` (every one, in
    the columns codes, codes_1, ...)."""
    assert set(got) == set(want)
    for ident, codes in want.items():
        levels = codes if isinstance(codes, tuple) else (codes,)
        for i, level in enumerate(levels):
            row = np.array(got[ident]["codes" if i == 0 else f"codes_{i}"])
            assert row.shape == level.shape, (ident, i, row.shape, level.shape)
            assert np.array_equal(row, level), (ident, i)
        assert got[ident]["n_frames"] == levels[0].shape[-1]


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    """SIGKILL the process group of `proc` as soon as `ready()` holds."""
    t0 = time.monotonic()
    while not ready():
        assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read()
        assert time.monotonic() - t0 < timeout, "never became ready"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out
