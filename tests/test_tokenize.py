"""`codec-run tokenize` on the local engine: codes equal to `encode` file by file, at batch 1 and
batch 4, every kind of input, the errors table, resuming after SIGKILL and after a killed
worker, and codes of another model refused. Codes against `encode` on every registered codec's
smoke export (which has batch-4 encoders); the job's own behaviour on one of them."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SMOKE_BATCH
from tokenize_support import (
    BIN,
    add_bad_files,
    assert_codes,
    children,
    kill_when,
    make_corpus,
    reference,
    reference_levels,
    rows,
    tokenize,
)

from codecport import registry

CODECS = registry.names()
BATCHED = [n for n in CODECS if registry.get(n).runtime.batchable]  # with encoders of batch 4
# The tests of the job itself (resuming, kills, folders, refusals) run on the smoke export that
# tokenizes fastest: what they check is the same code for every codec, and DAC's 10 s graphs made
# them three times slower.
JOB = "snac"


@pytest.mark.parametrize("name", CODECS)
def test_codes_equal_encode_at_batch_1_and_4(tmp_path, smoke_exports, name):
    folder = smoke_exports[name]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 6)  # every rate, stereo, FLAC, clips under a graph and past it
    bad = add_bad_files(corpus)
    want = reference_levels(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    out4 = tmp_path / "out4"
    proc = tokenize(corpus, "-m", folder, "-o", out4)
    assert f"{len(files)} files tokenized" in proc.stdout and f"{len(bad)} failed" in proc.stdout
    got = rows(out4)
    assert_codes(got, want)
    row = got[next(iter(want))]
    assert row["codec"] == name and row["codes"] and row["export_id"]
    assert row["duration_s"] == pytest.approx(row["num_samples"] / row["sample_rate"])
    errors = pq.read_table(out4 / "__errors__" / "errors.parquet").to_pylist()
    assert {e["id"] for e in errors} == set(bad)
    for e in errors:
        assert bad[e["id"]] in e["error"] and "\n" not in e["error"], e
    if name in BATCHED:  # without batched encoders the default run was batch 1 already
        out1 = tmp_path / "out1"
        tokenize(corpus, "-m", folder, "-o", out1, "--batch", "1", "--workers", "1")
        assert_codes(rows(out1), want)
    # The output is a dataset for Hugging Face datasets too.
    ds = datasets.load_dataset("parquet", data_dir=str(out4), split="train")
    assert ds.num_rows == len(files)
    first = ds[0]
    assert np.array_equal(np.array(first["codes"]), want[first["id"]][0])


def test_a_row_equals_the_codes_codec_run_encode_writes(tmp_path, smoke_exports):
    name = CODECS[0]  # one codebook scale: its codes fit a .npy
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 3)
    tokenize(corpus, "-m", smoke_exports[name], "-o", tmp_path / "out")
    got = rows(tmp_path / "out")
    for path in files:
        npy = tmp_path / "x.npy"
        subprocess.run([str(BIN / "codec-run"), "encode", str(path), "-m", str(smoke_exports[name]),
                        "-o", str(npy)], check=True, capture_output=True)
        assert np.array_equal(np.array(got[path.relative_to(corpus).as_posix()]["codes"]), np.load(npy))


def test_every_kind_of_input(tmp_path, smoke_exports):
    folder = smoke_exports[JOB]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 7)
    want_by_path = {str(p.resolve()): c for p, c in zip(files, reference(folder, dict(zip(files, files))).values())}
    (tmp_path / "list.txt").write_text("# clips\n" + "\n".join(str(p.relative_to(tmp_path)) for p in files[:2]))
    with open(tmp_path / "list.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "path", "speaker"])
        w.writerow(["utt-a", files[2], "s1"])
    (tmp_path / "list.jsonl").write_text(json.dumps({"id": "utt-b", "path": str(files[3])}) + "\n")
    pq.write_table(pa.table({"path": [str(files[4])]}), tmp_path / "list.parquet")
    # A dataset in Hugging Face's layout: an Audio column of {bytes, path} structs.
    hf = datasets.Dataset.from_dict({"id": ["hf-0"], "audio": [{"bytes": files[5].read_bytes(),
                                                                "path": files[5].name}]})
    hf = hf.cast_column("audio", datasets.Audio(decode=False))
    (tmp_path / "hub" / "data").mkdir(parents=True)
    hf.to_parquet(str(tmp_path / "hub" / "data" / "train-00000-of-00001.parquet"))
    out = tmp_path / "out"
    tokenize("list.txt", "list.csv", "list.jsonl", "list.parquet", "hub", str(corpus / "spk0" / "clip006.*"),
             "-m", folder, "-o", out, cwd=tmp_path)
    got = rows(out)
    # Manifests keep their ids (an id column, else the path as written); the glob's match is named
    # by its place under the folder that holds every input.
    assert set(got) == {str(files[0].relative_to(tmp_path)), str(files[1].relative_to(tmp_path)), "utt-a",
                        "utt-b", str(files[4]), "hf-0", "corpus/spk0/clip006.wav"}
    for ident, row in got.items():
        path = str(files[5].resolve()) if ident == "hf-0" else row["path"]
        assert np.array_equal(np.array(row["codes"]), want_by_path[path]), ident
    assert got["hf-0"]["path"].endswith("train-00000-of-00001.parquet#0")


def test_bad_inputs_of_the_job_are_one_line(tmp_path, smoke_exports):
    folder = smoke_exports[CODECS[0]]  # its batched encoder takes 4 rows: --batch 8 is refused
    (tmp_path / "a.wav").write_bytes(b"")
    (tmp_path / "dup.txt").write_text("a.wav\na.wav\n")
    (tmp_path / "nopath.csv").write_text("file\nx.wav\n")
    (tmp_path / "bad.jsonl").write_text("[1, 2]\n")
    cases = {"nothing/here": "no such file", "nomatch/*.wav": "matches no file",
             "dup.txt": "comes twice", "nopath.csv": "no 'path' column", "bad.jsonl": "not a JSON object"}
    for arg, words in cases.items():
        proc = tokenize(arg, "-m", folder, "-o", tmp_path / "out", check=False, cwd=tmp_path)
        assert proc.returncode == 1 and words in proc.stderr, (arg, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    proc = tokenize("a.wav", "-m", folder, "-o", tmp_path / "o2", "--batch", "8", check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "--batch 8" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_skips_done_redoes_changed_and_replaces_truncated(tmp_path, smoke_exports):
    folder = smoke_exports[JOB]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 10)
    out = tmp_path / "out"
    tokenize(corpus, "-m", folder, "-o", out, "--shard-rows", "1")
    first = rows(out)
    proc = tokenize(corpus, "-m", folder, "-o", out)
    assert "0 files tokenized" in proc.stdout and f"{len(files)} already done" in proc.stdout
    # A changed input is tokenized again, and its old row goes.
    changed = files[1]
    st = changed.stat()
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    # A shard a killed copy left truncated, and a temporary file of a killed write.
    shards = sorted(out.glob("part-*.parquet"))
    victim = next(s for s in shards if changed.name not in str(pq.read_table(s).column("path")))
    lost = pq.read_table(victim).column("id").to_pylist()
    victim.write_bytes(victim.read_bytes()[:100])
    (out / ".part-x.parquet.abc.part").write_bytes(b"half")
    proc = tokenize(corpus, "-m", folder, "-o", out)
    assert f"{1 + len(lost)} files tokenized" in proc.stdout, proc.stdout
    again = rows(out)
    assert set(again) == set(first)
    for ident, row in first.items():
        assert np.array_equal(np.array(again[ident]["codes"]), np.array(row["codes"]))
    assert not victim.exists() and not list(out.glob(".*.part"))


def test_codes_of_another_model_are_refused(tmp_path, smoke_exports):
    corpus = tmp_path / "corpus"
    make_corpus(corpus, 2)
    out = tmp_path / "out"
    a, b = (smoke_exports[n] for n in CODECS[:2])
    tokenize(corpus, "-m", a, "-o", out)
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
    tokenize(corpus, "-m", folder, "-o", out)
    # A clean run's codes are `encode`'s file by file (test_codes_equal_encode_at_batch_1_and_4).
    want = reference(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    assert_codes(rows(out), want)
    for ident, row in partial.items():  # the rows written before the kill were kept
        assert np.array_equal(np.array(row["codes"]), want[ident])


def test_a_killed_worker_is_replaced_and_nothing_is_lost(tmp_path, smoke_exports):
    folder = smoke_exports[JOB]
    corpus = tmp_path / "corpus"
    # Clips up to 4 s: the job must outlast the kill (SNAC's tiny export does 32 short clips in 6 s).
    files = make_corpus(corpus, 32, seed=4, max_s=4.0)
    out = tmp_path / "out"
    proc = _start([corpus, "-m", folder, "-o", out, "--workers", "2", "--shard-rows", "1", "-v"])
    t0 = time.monotonic()
    while not list(out.glob("part-*.parquet")):
        assert proc.poll() is None and time.monotonic() - t0 < 120
        time.sleep(0.02)
    workers = [p for p in children(proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert workers
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "worker died" in err
    got = rows(out)
    want = reference(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    assert_codes(got, want)


def test_export_batch_is_checked_before_exporting(tmp_path):
    proc = subprocess.run([str(BIN / "codec-export"), JOB, "--preset", "tiny", "--random-init",
                           "--len", "4000", "--batch", "4", "--precision", "fp16", "-o", str(tmp_path / "x")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--batch" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_smoke_exports_hold_batched_encoders_validated_row_by_row(smoke_exports):
    import codecport

    for folder in smoke_exports.values():
        codec = codecport.load(folder)
        manifest = json.loads((folder / "manifest.json").read_text())
        for graph in codec.batchable:
            if graph in codec.present:
                assert codec.batches[graph] == [SMOKE_BATCH]
                check = manifest["validation"][f"{graph}_b{SMOKE_BATCH}"]
                assert check["rows_codes_identical"] == 1.0 and check["rows_max_abs_err"] <= 1e-4


@pytest.mark.parametrize("name", BATCHED)
def test_batcher_full_padded_and_row_by_row_batches_give_encode_codes(smoke_exports, name):
    import codecport
    from codecport.runtime.audio import ArraySource
    from codecport.tokenize.batch import Batcher

    codec = codecport.load(smoke_exports[name])
    sr = codec.sample_rate
    graph = codec.window_plan(ArraySource(np.zeros((1, int(0.05 * sr)), np.float32), sr), None).graph
    assert graph in codec.batches
    rng = np.random.default_rng(1)
    for count in (1, 2, SMOKE_BATCH + 1):  # row by row; padded (half full); a full batch and one more
        clips = [(0.2 * rng.standard_normal((1, int(0.05 * sr)))).astype(np.float32) for _ in range(count)]
        calls = []
        opened = codec.graph

        class Counting:  # a graph that notes each run
            def __init__(self, g, _opened=opened, _calls=calls):
                self.g, self.inner, self.calls = g, _opened(g), _calls

            def __getattr__(self, key):
                return getattr(self.inner, key)

            def __call__(self, x):
                self.calls.append(self.g)
                return self.inner(x)

        graph_of = Counting

        codec.graph = graph_of
        try:
            batcher = Batcher(codec, SMOKE_BATCH)
            done = []
            for i, x in enumerate(clips):
                plan = codec.window_plan(ArraySource(x, sr), None)
                assert plan is not None and plan.graph == graph
                done += batcher.add(i, plan)
            done += batcher.flush()
        finally:
            del codec.graph
        got = dict(done)
        for i, x in enumerate(clips):
            assert np.array_equal(got[i].data, codec.encode(x, sr).data), (count, i)
        batched = f"{graph}_b{SMOKE_BATCH}"
        assert (batched in calls) == (count > 1), (count, calls)
        assert (graph in calls) == (count % SMOKE_BATCH == 1), (count, calls)


def test_a_failed_graph_call_fails_its_clips_only(smoke_exports):
    """The runtime fails one batched call (as ONNX Runtime does, out of GPU memory): each clip
    in that call comes back once with the error, and the clips before and after it get their codes."""
    import codecport
    from codecport.runtime.audio import ArraySource
    from codecport.tokenize.batch import Batcher

    codec = codecport.load(smoke_exports[BATCHED[0]])
    sr, opened, calls = codec.sample_rate, codec.graph, []

    class FailingSecondCall:  # the graph, whose second run of any graph fails
        def __init__(self, name):
            self.inner = opened(name)

        def __getattr__(self, key):
            return getattr(self.inner, key)

        def __call__(self, x):
            calls.append(x.shape)
            if len(calls) == 2:
                raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : out of memory")
            return self.inner(x)

    rng = np.random.default_rng(2)
    clips = [(0.2 * rng.standard_normal((1, int(0.05 * sr)))).astype(np.float32) for _ in range(2 * SMOKE_BATCH + 1)]
    codec.graph = FailingSecondCall
    try:
        batcher = Batcher(codec, SMOKE_BATCH)
        done = [r for i, x in enumerate(clips) for r in batcher.add(i, codec.window_plan(ArraySource(x, sr), None))]
        done += batcher.flush()
    finally:
        del codec.graph
    assert sorted(k for k, _ in done) == list(range(len(clips)))  # each clip once
    got = dict(done)
    for i, x in enumerate(clips):
        if SMOKE_BATCH <= i < 2 * SMOKE_BATCH:
            assert isinstance(got[i], RuntimeError) and "out of memory" in str(got[i]), i
        else:
            assert np.array_equal(got[i].data, codec.encode(x, sr).data), i


def test_folders_with_the_same_file_names_are_told_apart_and_resumed(tmp_path, smoke_exports):
    """`tokenize train/ test/` where both hold the same names: ids are each file's place under
    the folder holding both, so they cannot collide; a rerun does nothing; a folder tokenized
    alone first (its ids its own names) is not done again when both are given, only renamed."""
    folder = smoke_exports[JOB]
    train = make_corpus(tmp_path / "train", 3)
    test = make_corpus(tmp_path / "test", 3, seed=1)
    assert [p.relative_to(tmp_path / "train") for p in train] == [p.relative_to(tmp_path / "test") for p in test]
    out = tmp_path / "out"
    tokenize("train", "-m", folder, "-o", out, cwd=tmp_path)
    assert set(rows(out)) == {p.relative_to(tmp_path / "train").as_posix() for p in train}
    proc = tokenize("train", "test", "-m", folder, "-o", out, cwd=tmp_path)
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
    assert run([str(tmp_path / "empty")], a, out).files == 0
    make_corpus(tmp_path / "corpus", 1)
    assert run([str(tmp_path / "corpus")], b, out).done == 1
    assert {r["codec"] for r in rows(out).values()} == {CODECS[1]}
    with pytest.raises(registry.CodecportError, match="holds codes of another model"):
        run([str(tmp_path / "corpus")], a, out)  # now it holds codes: they are never mixed


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
    a, b = (smoke_exports[n] for n in CODECS[:2])
    late = registry.codec_of_folder(b).runtime(b, sessions=False)
    waiting = OutputDir(out, late, late.codebooks(None))  # the folder is empty: no objection yet
    tokenize(corpus, "-m", a, "-o", out)
    with pytest.raises(registry.CodecportError, match="holds codes of another model"), waiting.lock():
        pass
    assert {r["codec"] for r in rows(out).values()} == {CODECS[0]}


def test_the_driver_needs_only_the_manifest(tmp_path, smoke_exports, monkeypatch):
    """`--provider cuda` from a machine without a GPU (a Ray head node): the driver reads the
    folder's manifest and opens no session; only the workers need the provider. Here the engine
    stands in for workers that fail on every file, which the errors table then lists."""
    from codecport.errors import CodecportError
    from codecport.runtime import graph
    from codecport.tokenize import local
    from codecport.tokenize import tokenize as run
    from codecport.tokenize.output import result_table

    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 3)
    monkeypatch.setattr(graph, "open_graph", lambda *a, **k: pytest.fail("the driver opened a session"))
    seen = {}

    def workers_elsewhere(todo, settings, workers, per_task, emit):
        seen["provider"] = settings.provider
        emit(result_table(settings.facts(), todo, {i.id: CodecportError("no GPU on this worker") for i in todo}))

    monkeypatch.setattr(local, "run_local", workers_elsewhere)
    summary = run([str(corpus)], smoke_exports[JOB], tmp_path / "out", provider="cuda")
    assert seen["provider"] == "cuda" and summary.failed == len(files) and summary.done == 0
    errors = pq.read_table(tmp_path / "out" / "__errors__" / "errors.parquet").to_pylist()
    assert {e["error"] for e in errors} == {"no GPU on this worker"}
