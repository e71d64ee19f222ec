"""`codec-run tokenize` on the local engine, the job itself: resuming after SIGKILL and after a
killed worker, changed and truncated inputs, codes of another model refused, folders and links
told apart, the output folder claimed only once it holds rows. (test_tokenize.py: the codes.)
Apart from test_tokenize.py so that the test processes share the work evenly."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenize_support import (
    BIN,
    assert_codes,
    children,
    kill_when,
    make_corpus,
    reference,
    rows,
    tokenize,
)

from codecport import registry

CODECS = registry.names()
# The tests of the job itself (resuming, kills, folders, refusals) run on the smoke export that
# tokenizes fastest: what they check is the same code for every codec, and DAC's 10 s graphs made
# them three times slower.
JOB = "snac"
OTHER = next(n for n in CODECS if n != JOB)  # a model whose codes the job's are not
# One worker process where how many does not matter: each more is a process and its sessions, for
# a handful of files (several run in the killed-worker test).
ONE = ("--workers", "1")


def test_resume_skips_done_redoes_changed_and_replaces_truncated(tmp_path, smoke_exports):
    folder = smoke_exports[JOB]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 10)
    out = tmp_path / "out"
    tokenize(corpus, "-m", folder, "-o", out, "--shard-rows", "1", *ONE)
    first = rows(out)
    proc = tokenize(corpus, "-m", folder, "-o", out)
    assert "0 files tokenized" in proc.stdout and f"{len(files)} already done" in proc.stdout
    # A changed input is tokenized again, and its old row goes.
    changed = files[1]
    st = changed.stat()
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    # A shard a killed copy left truncated, and a temporary file of a killed write; a hidden
    # `.part` file of the user's own (a browser's download) is not ours, and stays.
    shards = sorted(out.glob("part-*.parquet"))
    victim = next(s for s in shards if changed.name not in str(pq.read_table(s).column("path")))
    lost = pq.read_table(victim).column("id").to_pylist()
    victim.write_bytes(victim.read_bytes()[:100])
    (out / ".part-0123456789ab-00003.parquet.k2j_x9.part").write_bytes(b"half")
    (out / ".movie.mkv.part").write_bytes(b"theirs")
    proc = tokenize(corpus, "-m", folder, "-o", out, *ONE)
    assert f"{1 + len(lost)} files tokenized" in proc.stdout, proc.stdout
    again = rows(out)
    assert set(again) == set(first)
    for ident, row in first.items():
        assert np.array_equal(np.array(again[ident]["codes"]), np.array(row["codes"]))
    assert not victim.exists() and [p.name for p in out.glob(".*.part")] == [".movie.mkv.part"]


def test_codes_of_another_model_are_refused(tmp_path, smoke_exports):
    corpus = tmp_path / "corpus"
    make_corpus(corpus, 2)
    out = tmp_path / "out"
    a, b = (smoke_exports[n] for n in (JOB, OTHER))  # b is refused before any encoding
    tokenize(corpus, "-m", a, "-o", out, *ONE)
    proc = tokenize(corpus, "-m", b, "-o", out, check=False)
    assert proc.returncode == 1 and "another model" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    proc = tokenize(corpus, "-m", a, "-o", tmp_path / "mine", check=False)
    assert proc.returncode == 1 and "not a codecport tokenize output" in proc.stderr


def _start(args, **kw) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "codec-run"), "tokenize", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def test_sigkill_midway_then_rerun_gives_every_input_once(tmp_path, smoke_exports):
    folder = smoke_exports[JOB]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 32, seed=3)
    out = tmp_path / "out"
    proc = _start([corpus, "-m", folder, "-o", out, "--workers", "1", "--shard-rows", "1"])
    kill_when(proc, lambda: len(list(out.glob("part-*.parquet"))) >= 1)
    partial = rows(out)
    assert 0 < len(partial) < len(files)
    tokenize(corpus, "-m", folder, "-o", out, *ONE)
    # A clean run's codes are `encode`'s file by file (test_codes_equal_encode_at_batch_1_and_4).
    want = reference(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    assert_codes(rows(out), want)
    for ident, row in partial.items():  # the rows written before the kill were kept
        assert np.array_equal(np.array(row["codes"]), want[ident])


def test_a_killed_worker_is_replaced_and_nothing_is_lost(tmp_path, smoke_exports):
    """Both workers are stopped (SIGSTOP) as soon as they exist, before they can have finished
    anything; one is then killed and the other let go: the pool must see a worker die with the
    job's tasks still to do, whatever the machine's speed (a kill after the first output file
    raced the job's end on a fast CPU)."""
    folder = smoke_exports[JOB]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 32, seed=4, max_s=4.0)
    out = tmp_path / "out"
    proc = _start([corpus, "-m", folder, "-o", out, "--workers", "2", "--shard-rows", "1", "-v"])

    def workers() -> list[int]:
        return [p for p in children(proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]

    t0 = time.monotonic()
    while len(workers()) < 2:
        assert proc.poll() is None and time.monotonic() - t0 < 120, "the workers never started"
        time.sleep(0.01)
    first, second = workers()[:2]
    for pid in (first, second):
        os.kill(pid, signal.SIGSTOP)
    assert not list(out.glob("part-*.parquet"))  # nothing done yet: the kill comes before any output
    os.kill(first, signal.SIGKILL)
    os.kill(second, signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "worker died" in err
    got = rows(out)
    want = reference(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    assert_codes(got, want)


def test_folders_with_the_same_file_names_are_told_apart_and_resumed(tmp_path, smoke_exports):
    """`tokenize train/ test/` where both hold the same names: ids are each file's place under
    the folder holding both, so they cannot collide; a rerun does nothing; a folder tokenized
    alone first (its ids its own names) is not done again when both are given, only renamed."""
    folder = smoke_exports[JOB]
    train = make_corpus(tmp_path / "train", 3)
    test = make_corpus(tmp_path / "test", 3, seed=1)
    assert [p.relative_to(tmp_path / "train") for p in train] == \
        [p.relative_to(tmp_path / "test") for p in test]
    out = tmp_path / "out"
    tokenize("train", "-m", folder, "-o", out, *ONE, cwd=tmp_path)
    assert set(rows(out)) == {p.relative_to(tmp_path / "train").as_posix() for p in train}
    proc = tokenize("train", "test", "-m", folder, "-o", out, *ONE, cwd=tmp_path)
    assert "3 files tokenized" in proc.stdout and "3 already done" in proc.stdout, proc.stdout
    got = rows(out)
    assert set(got) == {p.relative_to(tmp_path).as_posix() for p in [*train, *test]}
    want = reference(folder, {p.relative_to(tmp_path).as_posix(): p for p in [*train, *test]})
    for ident, codes in want.items():
        assert np.array_equal(np.array(got[ident]["codes"]), codes), ident
    proc = tokenize("train", "test", "-m", folder, "-o", out, cwd=tmp_path)
    assert "0 files tokenized" in proc.stdout and "6 already done" in proc.stdout


def test_a_worker_that_cannot_open_the_model_ends_the_job_with_its_cause(tmp_path, smoke_exports):
    """Through the API, where nothing checks the provider first (the CLI does): the workers,
    asked for one this onnxruntime lacks, cannot open the model. The job ends at once with that
    cause, not as workers that died over and over."""
    from codecport.errors import ProviderError
    from codecport.tokenize.driver import tokenize as run

    make_corpus(tmp_path / "corpus", 2)
    with pytest.raises(ProviderError, match="CUDAExecutionProvider is not available"):
        run([str(tmp_path / "corpus")], smoke_exports[JOB], tmp_path / "out", provider="cuda", workers=1)


def test_a_run_that_wrote_no_row_claims_no_folder(tmp_path, smoke_exports):
    """A wrong input path is refused before the output folder is made; a run that wrote no row
    (its inputs held nothing) does not keep the folder for its model."""
    from codecport.tokenize.corpus import InputError
    from codecport.tokenize.driver import tokenize as run

    a, b = (smoke_exports[n] for n in CODECS[:2])
    out = tmp_path / "out"
    with pytest.raises(InputError, match="no such file or folder"):
        run([str(tmp_path / "typo")], a, out)
    assert not out.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no audio file tokenize reads .it is empty."):
        run([str(tmp_path / "empty")], a, out)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.wav").write_bytes(b"RIFFjunk")
    result = run([str(tmp_path / "bad")], a, out)
    assert result.files == 1 and result.done == 0 and (out / "__errors__").is_dir()  # an errors table only
    make_corpus(tmp_path / "corpus", 1)
    assert run([str(tmp_path / "corpus")], b, out).done == 1
    assert {r["codec"] for r in rows(out).values()} == {CODECS[1]}
    with pytest.raises(registry.CodecportError, match="holds codes of another model"):
        run([str(tmp_path / "corpus")], a, out)  # now it holds codes: they are never mixed


def test_a_ray_address_nobody_answers_is_refused_at_once(tmp_path, smoke_exports, monkeypatch):
    """ray.init retried an address no head listens on for minutes (its C++ logs printing), after
    the output folder was claimed: now one line at once, and nothing made."""
    import socket

    from codecport.tokenize.driver import tokenize as run

    make_corpus(tmp_path / "corpus", 1)
    with socket.socket() as s:  # a port bound but never listened on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        for given in ({"address": f"127.0.0.1:{port}"}, {"env": f"ray://127.0.0.1:{port}"}):
            if "env" in given:
                monkeypatch.setenv("RAY_ADDRESS", given["env"])
            with pytest.raises(registry.CodecportError,
                               match=f"cannot reach the Ray cluster at .*127.0.0.1:{port}"):
                run([str(tmp_path / "corpus")], smoke_exports[CODECS[0]], tmp_path / "out", engine="ray",
                    address=given.get("address"))
    assert not (tmp_path / "out").exists()


def test_a_link_keeps_its_own_id(tmp_path):
    """A Hugging Face snapshot: its files are links into a blobs folder outside it. A link's id is
    its own place (the target's name is a hash), given as a folder or as a pattern."""
    from codecport.tokenize.corpus import read_inputs

    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "9f86d081").write_bytes(b"RIFF")
    (tmp_path / "snapshot" / "data").mkdir(parents=True)
    (tmp_path / "snapshot" / "data" / "a.wav").symlink_to(tmp_path / "blobs" / "9f86d081")
    for given in ("snapshot", "snapshot/**/*.wav"):
        items = read_inputs([str(tmp_path / given)])
        assert [i.id for i in items] == ["data/a.wav"], given
        assert items[0].path == str(tmp_path / "blobs" / "9f86d081")


def test_the_folder_is_checked_for_its_model_once_locked(tmp_path, smoke_exports):
    """A job that checked an empty folder, then waited while another job for another model
    began it, is refused when it takes the lock, before it writes a row."""
    from codecport.tokenize.output import OutputDir

    corpus = tmp_path / "corpus"
    make_corpus(corpus, 2)
    out = tmp_path / "out"
    a, b = (smoke_exports[n] for n in (JOB, OTHER))  # b is refused before any encoding
    late = registry.codec_of_folder(b).runtime(b, sessions=False)
    waiting = OutputDir(out, late, late.codebooks(None))  # the folder is empty: no objection yet
    tokenize(corpus, "-m", a, "-o", out, *ONE)
    with pytest.raises(registry.CodecportError, match="holds codes of another model"), waiting.lock():
        pass
    assert {r["codec"] for r in rows(out).values()} == {JOB}


def test_a_worker_sends_its_result_in_one_atomic_write(tmp_path, monkeypatch):
    """A result the pool's pipe carried in pieces hung the job when its worker was killed between
    them (the pool's reader waits for the rest forever): the worker writes its table to a file and
    sends the path, a message the kernel writes whole (under PIPE_BUF)."""
    import pickle
    import select

    import pyarrow as pa

    from codecport.tokenize import local

    table = pa.table({"id": [f"clip-{i}" for i in range(20000)], "codes": [list(range(64))] * 20000})
    monkeypatch.setattr(local, "_worker", lambda items: table)
    sent = local._work([], str(tmp_path))
    assert len(pickle.dumps(sent)) < select.PIPE_BUF < len(pickle.dumps(table))
    assert local._take(sent).equals(table)
    assert list(tmp_path.iterdir()) == []  # taken: nothing left in the spool


def test_a_spool_that_cannot_be_written_is_one_line_that_says_what_to_do(tmp_path, monkeypatch):
    import pyarrow as pa

    from codecport.errors import CodecportError
    from codecport.tokenize import local

    monkeypatch.setattr(local, "_worker", lambda items: pa.table({"id": ["a"]}))
    with pytest.raises(CodecportError, match="set TMPDIR to a folder with room"):
        local._take(local._work([], str(tmp_path / "gone")))


def test_a_killed_drivers_spool_is_removed_by_the_next_job(tmp_path, monkeypatch):
    """A driver SIGKILLed never removes its results spool: the next job removes those of drivers
    that are gone, and leaves a live driver's alone."""
    import sys
    import tempfile

    from codecport.tokenize import local

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{local.SPOOL}{gone.pid}-abc"
    live = tmp_path / f"{local.SPOOL}{os.getppid()}-def"
    for d in (dead, live):
        d.mkdir()
        (d / "result").write_bytes(b"rows")
    other = tmp_path / "not-ours"
    other.mkdir()
    spool = Path(local._new_spool())
    assert spool.parent == tmp_path and spool.name.startswith(f"{local.SPOOL}{os.getpid()}-")
    assert not dead.exists() and live.exists() and other.exists()


def test_what_the_folder_holds_that_is_not_its_codes_is_refused_and_left_alone(tmp_path, smoke_exports):
    """A shard of another model copied in, a Parquet file of the user's own named as a shard, a
    damaged file not named as ours: each refused in one line before anything changes (the first
    replaced the folder's own shard, the other two were deleted). An input listed but gone keeps
    its codes from before; in a new folder it is a failed row that says so."""
    import pyarrow as pa

    from codecport.errors import CodecportError
    from codecport.tokenize.driver import tokenize as run

    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 2)
    a, b = (smoke_exports[n] for n in (JOB, OTHER))
    out, other = tmp_path / "out", tmp_path / "other"
    run([str(corpus)], a, out, workers=1)
    run([str(corpus)], b, other, workers=1)
    ours = {p.name: p.read_bytes() for p in out.glob("part-*.parquet")}
    pq.write_table(pa.table({"speaker": ["s1"]}), tmp_path / "labels.parquet")
    cases = {"part-0000-00000.parquet": (next(other.glob("part-*.parquet")), "holds codes of another model"),
             "part-labels.parquet": (tmp_path / "labels.parquet",
                                     "is not a shard of codes .it has no 'id' column"),
             "part-x.parquet": (None, "does not open as Parquet")}
    for name, (source, words) in cases.items():
        data = source.read_bytes() if source else b"PAR1 not really"
        (out / name).write_bytes(data)
        with pytest.raises(CodecportError, match=words):
            run([str(corpus)], a, out, workers=1)
        assert (out / name).read_bytes() == data
        (out / name).unlink()
        assert {p.name: p.read_bytes() for p in out.glob("part-*.parquet")} == ours

    manifest = tmp_path / "list.txt"
    manifest.write_text("".join(f"{f}\n" for f in files))
    run([str(manifest)], a, tmp_path / "m", workers=1)
    files[0].rename(tmp_path / "away")
    assert run([str(manifest)], a, tmp_path / "m", workers=1).skipped == 2  # its row is kept
    assert run([str(manifest)], a, tmp_path / "n", workers=1).failed == 1
    (error,) = pq.read_table(tmp_path / "n" / "__errors__" / "errors.parquet").column("error").to_pylist()
    assert "no such file" in error, error
