"""What codecport.mjs reads, refused as the Python runtime refuses it, run in Node (no browser):
codes files that lie, inflate past any bound, are damaged, or hold codes that are not int32
integers; manifests whose plans or graph entries are damaged; the npm package holds every
module the entry point imports. Every refusal is a CodecportError with one line; no other
error escapes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

WEB = Path(__file__).resolve().parents[1] / "codecport" / "web"

# Reads each file given and prints one JSON line a file: {ok, shape, data} or {error, name}.
READ = """
import { readCodes } from "%s/codecport-codes.mjs";
import { readFileSync } from "node:fs";
for (const f of process.argv.slice(1)) {
  try {
    const c = await readCodes(process.env.BUFFER ? readFileSync(f) : new Uint8Array(readFileSync(f)));
    console.log(JSON.stringify({ ok: true, shape: c.shape, data: Array.from(c.data),
                                 numSamples: c.numSamples }));
  } catch (e) { console.log(JSON.stringify({ name: e.name, error: e.message })); }
}
"""


def node(script: str, *args, env: dict | None = None) -> list[dict]:
    exe = shutil.which("node")
    assert exe, "node is not installed: bash scripts/setup_web.sh installs it"
    proc = subprocess.run([exe, "--input-type=module", "-e", script, *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def read_codes(*files, env=None) -> list[dict]:
    return node(READ % WEB.as_posix(), *files, env=env)


def npz(path: Path, compress: bool = False, **arrays) -> Path:
    (np.savez_compressed if compress else np.savez)(path, **arrays)
    return path


GOOD = {"codes_0": np.arange(12, dtype=np.int64).reshape(1, 3, 4) % 7, "codec": np.array("dac"),
        "sample_rate": np.array(16000), "num_samples": np.array(20)}


def test_a_codes_file_reads_from_a_uint8array_and_from_a_node_buffer(tmp_path):
    good = npz(tmp_path / "good.npz", **GOOD)
    want = {"ok": True, "shape": [3, 4], "data": GOOD["codes_0"].ravel().tolist(), "numSamples": 20}
    assert read_codes(good) == [want]
    # A Buffer's slice is a view of a pool shared with other buffers: it read the wrong bytes.
    assert read_codes(good, env={**os.environ, "BUFFER": "1"}) == [want]


@pytest.mark.parametrize("change, words", [
    ({"num_samples": np.array(-5)}, "original length -5 is impossible"),
    ({"num_samples": np.array(600.5)}, "original length 600.5 is impossible"),
    ({"sample_rate": np.array(0)}, "original sample rate 0 is not an audio rate"),
    ({"loudness_db": np.array(np.nan)}, "loudness NaN dB is not a measured level"),
    ({"mode": np.array("bogus")}, 'mode "bogus" is not one of'),
    ({"codes_0": GOOD["codes_0"] + 0.5}, "codes must be integers, got Float64Array"),
    ({"codes_0": GOOD["codes_0"] + (1 << 32)}, "codes must be integers in the codebook, found 4294967296"),
])
def test_a_lying_codes_file_is_refused(tmp_path, change, words):
    (got,) = read_codes(npz(tmp_path / "c.npz", **{**GOOD, **change}))
    assert got.get("name") == "CodecportError" and words in got["error"], got


def test_a_zip_bomb_is_refused_before_it_inflates(tmp_path):
    """512 MiB of zeros in a half-megabyte file: the Python reader refuses it, and now the
    module does too (it took 2.2 GB of memory and returned the codes)."""
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z, \
            z.open("codes_0.npy", "w", force_zip64=True) as f:
        f.write(b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (1, 4, 16777216), }"
                .ljust(128 - 1) + b"\n")
        chunk = bytes(1 << 20)
        for _ in range(512):
            f.write(chunk)
    (got,) = read_codes(bomb)
    assert got.get("name") == "CodecportError" and "refusing a likely zip bomb" in got["error"], got


def test_a_damaged_archive_is_one_codecport_error(tmp_path):
    """Bytes flipped anywhere in a codes file (stored and deflated members): each read ends in
    the codes or a CodecportError (a flipped bit in the data fails its CRC-32; bad offsets, shapes
    and text widths were RangeErrors)."""
    rng = np.random.default_rng(0)
    files = []
    for compress in (False, True):
        good = npz(tmp_path / f"good{int(compress)}.npz", compress, **GOOD).read_bytes()
        for i in range(60):
            bad = bytearray(good)
            for at in rng.integers(0, len(bad), 1 + i % 3):
                bad[at] = int(rng.integers(0, 256))
            files.append(tmp_path / f"bad{int(compress)}-{i}.npz")
            files[-1].write_bytes(bytes(bad))
    results = read_codes(*files)
    assert len(results) == len(files)
    assert all(r.get("ok") or r.get("name") == "CodecportError" for r in results), \
        [r for r in results if not r.get("ok") and r.get("name") != "CodecportError"]
    flipped = bytearray(npz(tmp_path / "flip.npz", **GOOD).read_bytes())
    at = flipped.index(b"\x93NUMPY") + 128 + 8  # a byte of the codes' data
    flipped[at] ^= 1
    (tmp_path / "flip.npz").write_bytes(bytes(flipped))
    (got,) = read_codes(tmp_path / "flip.npz")
    assert got.get("name") == "CodecportError" and "fails its CRC-32" in got["error"], got


CHECK = """
import { checkManifest } from "%s/codecport-manifest.mjs";
const manifest = JSON.parse(process.argv[1]);
try { checkManifest("http://x/", manifest); console.log(JSON.stringify({ ok: true })); }
catch (e) { console.log(JSON.stringify({ name: e.name, error: e.message })); }
"""

PLANS = {"encode": [{"graph": "encoder", "mode": "fixed", "frames": 100, "samples": 600, "fits": "exact"},
                    {"graph": "encoder_chunked", "mode": "chunked", "frames": 56, "samples": 600,
                     "window": 600, "step": 68, "delay": 264}],
         "decode": [{"graph": "decoder", "mode": "windowed", "frames": 25, "samples": 4000, "overlap": 6}],
         "loudness": {"stages": [[1.0, [1, 2, 3], [1, 2, 3]]], "block_s": 0.4, "overlap": 0.75}}
GRAPHS = {"encoder": {"file": "encoder.onnx", "inputs": [{"name": "audio", "shape": [1, 1, 600]}],
                      "outputs": [{"name": "codes", "shape": [1, 4, 100]}]}}


@pytest.mark.parametrize("plans, graphs, words", [
    (PLANS, GRAPHS, None),
    ({**PLANS, "encode": [{**PLANS["encode"][1], "step": 0}]}, GRAPHS,
     "plan's step is 0, not a positive integer"),
    ({**PLANS, "encode": [None]}, GRAPHS, "a plan of encode names no graph"),
    ({**PLANS, "decode": [{**PLANS["decode"][0], "overlap": 25}]}, GRAPHS,
     "overlap 25 is not under its 25 frames"),
    ({**PLANS, "decode": [{**PLANS["decode"][0], "mode": "streaming"}]}, GRAPHS,
     'mode "streaming" is not one of'),
    ({**PLANS, "loudness": {"block_s": 0.4}}, GRAPHS, "loudness plan is not one codec-export writes"),
    (PLANS, {"encoder": {"file": "encoder.onnx"}}, "its entry of encoder has no file, inputs and outputs"),
    (PLANS, {"encoder": {**GRAPHS["encoder"], "inputs": [{"name": "audio", "shape": [1, 1, -1]}]}},
     "encoder's audio has no static shape"),
])
def test_a_damaged_manifest_is_refused_as_it_loads(plans, graphs, words):
    """A plan's step of 0 made encode loop forever, taking memory; the others were TypeErrors at
    the first call."""
    (got,) = node(CHECK % WEB.as_posix(), json.dumps({"codec": "dac", "plans": plans, "graphs": graphs}))
    if words is None:
        assert got == {"ok": True}
        return
    assert got.get("name") == "CodecportError" and words in got["error"] and "re-export" in got["error"], got


def test_the_npm_package_holds_every_module(tmp_path):
    """`npm pack` of codecport/web: every module the entry point imports is in it (two were left
    out, so the published package could not be imported)."""
    npm = shutil.which("npm")
    assert npm, "npm is not installed: bash scripts/setup_web.sh installs it"
    proc = subprocess.run([npm, "pack", "--dry-run", "--json"], cwd=WEB, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    packed = {f["path"] for f in json.loads(proc.stdout)[0]["files"]}
    modules = {p.name for p in WEB.glob("*.mjs")}
    assert modules <= packed, modules - packed
    imported = {name for p in WEB.glob("*.mjs")
                for name in re.findall(r'from "\./([\w-]+\.mjs)"', p.read_text())}
    assert imported <= packed
