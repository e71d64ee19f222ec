"""`codec-run tokenize --engine ray`: a private local cluster whose job is SIGKILLed midway and
resumed, and a real two-node cluster started on 127.0.0.1 (one CPU each), attached to with
--address, on which an actor is killed midway. Codes must equal `encode` file by file, every
input once, and no Ray daemon may outlive its cluster."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenize_support import (
    BIN,
    add_bad_files,
    assert_codes,
    kill_when,
    make_corpus,
    reference,
    reference_levels,
    rows,
    tokenize,
)

WINDOWED = "snac"  # the two-node cluster's codec: its long clips go through batched windows
RAY = str(BIN / "ray")
# No usage report, no dashboard; the nodes' logs stay in Ray's own temp folder.
ENV = {"RAY_USAGE_STATS_ENABLED": "0"}

pytestmark = pytest.mark.ray


def _ray_processes() -> set[int]:
    """Ray's daemons (raylet, gcs_server) running now."""
    out = set()
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmd.read_bytes()
        except OSError:
            continue
        if b"raylet" in text or b"gcs_server" in text:
            out.add(int(cmd.parent.name))
    return out


def _start(args, env=None) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "codec-run"), "tokenize", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **ENV, **(env or {})})


def test_private_cluster_sigkilled_midway_then_resumed(tmp_path, smoke_exports):
    # Mimi here and SNAC on the two-node cluster: both kinds of batch on Ray (SNAC's windows;
    # Mimi's padded clips and its streamed long ones). test_tokenize runs every codec, SNAC's
    # codes of several time scales included: the driver writes the rows for both engines.
    folder = smoke_exports["mimi"]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 20, seed=6, max_s=0.5)
    bad = add_bad_files(corpus)
    out = tmp_path / "out"
    before = _ray_processes()
    proc = _start([corpus, "-m", folder, "-o", out, "--engine", "ray", "--workers", "1", "--shard-rows", "1"])
    kill_when(proc, lambda: len(list(out.glob("part-*.parquet"))) >= 1)
    partial = rows(out)
    assert 0 < len(partial) < len(files)
    deadline = time.monotonic() + 30  # the killed driver's private cluster goes with it
    while _ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _ray_processes() - before, "the killed job's cluster is still running"
    proc = tokenize(corpus, "-m", folder, "-o", out, "--engine", "ray", "--workers", "2", env=ENV)
    assert f"{len(files) - len(partial)} files tokenized" in proc.stdout and f"{len(bad)} failed" in proc.stdout
    assert "core_worker" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr
    want = reference_levels(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    assert_codes(rows(out), want)
    for ident in partial:  # the rows written before the kill were kept, not redone
        assert np.array_equal(np.array(partial[ident]["codes"]), want[ident][0])
    errors = pq.read_table(out / "__errors__" / "errors.parquet").column("id").to_pylist()
    assert set(errors) == set(bad)
    assert _ray_processes() <= before, "the private cluster outlived the job"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on 127.0.0.1, one CPU each: (address, env), stopped at the end, pass or fail."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # The nodes and the jobs share a token (Ray's token auth, which `ray start` turns on).
    auth = {**ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env = {**os.environ, **auth}
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), "--include-dashboard", "false", *common],
                       check=True, capture_output=True, timeout=120, env=env)
        subprocess.run([RAY, "start", "--address", address, *common], check=True, capture_output=True,
                       timeout=120, env=env)
        deadline, status = time.monotonic() + 60, ""
        while "/2.0 CPU" not in status:  # both nodes registered: the cluster has two CPUs
            assert time.monotonic() < deadline, status
            time.sleep(1)
            status = subprocess.run([RAY, "status", "--address", address], check=False,
                                    capture_output=True, text=True, timeout=60, env=env).stdout
        yield address, auth
    finally:
        subprocess.run([RAY, "stop", "--force"], check=False, capture_output=True, timeout=120, env=env)
    assert not _ray_processes(), "ray stop left daemons running"


def test_two_node_cluster_codes_equal_encode(tmp_path, smoke_exports, cluster):
    address, auth = cluster
    folder = smoke_exports[WINDOWED]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 16, seed=5)
    out = tmp_path / "out"
    proc = tokenize(corpus, "-m", folder, "-o", out, "--engine", "ray", "--address", address,
                    "--workers", "2", env=auth)
    assert f"{len(files)} files tokenized" in proc.stdout
    assert_codes(rows(out), reference(folder, {p.relative_to(corpus).as_posix(): p for p in files}))
    proc = tokenize(corpus, "-m", folder, "-o", out, "--engine", "ray", "--address", address, env=auth)
    assert f"{len(files)} already done" in proc.stdout


def test_a_killed_actor_is_replaced_and_nothing_is_lost(tmp_path, smoke_exports, cluster):
    address, auth = cluster
    folder = smoke_exports[WINDOWED]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 24, seed=7, max_s=4.0)  # long enough to outlast the kill
    out = tmp_path / "out"
    proc = _start([corpus, "-m", folder, "-o", out, "--engine", "ray", "--address", address,
                   "--workers", "1", "--shard-rows", "1"], env=auth)
    t0 = time.monotonic()
    while not list(out.glob("part-*.parquet")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() - t0 < 120
        time.sleep(0.02)
    actors = [int(c.parent.name) for c in Path("/proc").glob("[0-9]*/cmdline") if b"MapWorker" in _read(c)]
    assert actors, "no actor process found"
    os.kill(actors[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    got = rows(out)
    assert_codes(got, reference(folder, {p.relative_to(corpus).as_posix(): p for p in files}))


def _read(path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
