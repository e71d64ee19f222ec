"""`codec-run tokenize` on the local engine, the codes: equal to `encode` file by file on every
registered codec's smoke export, at batch 1 and batch 4 (its batched encoders), every kind of
input, the errors table, batches full, padded and row by row. (test_tokenize_job.py: resuming,
kills, folders.)"""

from __future__ import annotations

import csv
import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from cli_support import invoke
from shared_exports import SMOKE_BATCH
from tokenize_support import (
    add_bad_files,
    assert_codes,
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
# The per-codec corpus's clips run up to 1.2 s (past every smoke export's fixed graphs but DAC's
# 2 s ones). Mimi's up to 0.5 s: past its 0.1 s graphs it streams a frame (1 ms at the tiny
# preset) a call, about 1.3 CPU-s an audio second on each of the test's three passes; 0.5 s still
# runs past its attention's 250-frame context.
LONGEST = {"mimi": 0.5}


@pytest.mark.parametrize("name", CODECS)
def test_codes_equal_encode_at_batch_1_and_4(tmp_path, smoke_exports, name):
    folder = smoke_exports[name]
    corpus = tmp_path / "corpus"
    # Every rate, stereo, FLAC, clips under a graph and past it.
    files = make_corpus(corpus, 6, max_s=LONGEST.get(name, 1.2))
    bad = add_bad_files(corpus)
    want = reference_levels(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    out4 = tmp_path / "out4"
    # One worker: a second is a process and sessions of its own for 9 inputs (the pool of several
    # is test_every_kind_of_input's and test_tokenize_job's).
    proc = tokenize(corpus, "-m", folder, "-o", out4, "--workers", "1")
    assert f"{len(files)} files tokenized" in proc.stdout and f"{len(bad)} failed" in proc.stdout
    got = rows(out4)
    assert_codes(got, want)
    ident = next(iter(want))
    row = got[ident]
    assert row["codec"] == name and row["codes"] and row["export_id"]
    info = sf.info(corpus / ident)  # the file's own length and rate
    assert (row["num_samples"], row["sample_rate"]) == (info.frames, info.samplerate)
    assert row["duration_s"] == pytest.approx(info.duration)
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
    tokenize(corpus, "-m", smoke_exports[name], "-o", tmp_path / "out", "--workers", "1")
    got = rows(tmp_path / "out")
    for path in files:  # `codec-run encode` in this process: the file it writes is what is compared
        npy = tmp_path / "x.npy"
        proc = invoke("codec-run", "encode", path, "-m", smoke_exports[name], "-o", npy)
        assert proc.returncode == 0, proc.stderr
        assert np.array_equal(np.array(got[path.relative_to(corpus).as_posix()]["codes"]), np.load(npy))


def test_every_kind_of_input(tmp_path, smoke_exports):
    folder = smoke_exports[JOB]
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, 7)
    want_by_path = {str(p.resolve()): c
                    for p, c in zip(files, reference(folder, dict(zip(files, files))).values())}
    (tmp_path / "list.txt").write_text("# clips\n"
                                       + "\n".join(str(p.relative_to(tmp_path)) for p in files[:2]))
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


def test_bad_inputs_of_the_job_are_one_line(tmp_path, smoke_exports, monkeypatch):
    # The command's contract (exit code, one line on stderr): in this process (cli_support).
    folder = smoke_exports[CODECS[0]]  # its batched encoder takes 4 rows: --batch 8 is refused
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.wav").write_bytes(b"")
    (tmp_path / "dup.txt").write_text("a.wav\na.wav\n")
    (tmp_path / "nopath.csv").write_text("file\nx.wav\n")
    (tmp_path / "bad.jsonl").write_text("[1, 2]\n")
    (tmp_path / "long.txt").write_text("a" * (1 << 20))  # read a line's bound at a time, not whole
    (tmp_path / "m4a").mkdir()
    (tmp_path / "m4a" / "a.m4a").write_bytes(b"")
    cases = {"nothing/here": "no such file", "nomatch/*.wav": "matches no file",
             "dup.txt": "comes twice", "nopath.csv": "no 'path' column", "bad.jsonl": "not a JSON object",
             "long.txt": "line 1 is longer than 64 KiB",
             "m4a": "holds no audio file tokenize reads (it holds .m4a)"}
    for arg, words in cases.items():
        proc = invoke("codec-run", "tokenize", arg, "-m", folder, "-o", tmp_path / "out")
        assert proc.returncode == 1 and words in proc.stderr, (arg, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert not (tmp_path / "out").exists()
    proc = invoke("codec-run", "tokenize", "a.wav", "-m", folder, "-o", tmp_path / "o2", "--batch", "8")
    assert proc.returncode == 1 and "--batch 8" in proc.stderr and "Traceback" not in proc.stderr
    # Not one input tokenized: the errors table is written, and the exit status says so.
    proc = invoke("codec-run", "tokenize", "a.wav", "-m", folder, "-o", tmp_path / "o3")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: every input this run tried failed (1), "
                                                           "as a.wav: ")
    assert (tmp_path / "o3" / "__errors__" / "errors.parquet").is_file()
    for out in (tmp_path / "a.wav" / "out", tmp_path / ("x" * 300)):  # under a file; a name too long
        proc = invoke("codec-run", "tokenize", "a.wav", "-m", folder, "-o", out)
        assert proc.returncode == 1 and proc.stderr.startswith(f"error: cannot write {out}"), proc.stderr


def test_a_manifest_that_lists_nothing_is_refused_as_an_empty_folder_is(tmp_path):
    """It was a job of nothing, exit 0, where an empty folder is an error."""
    from codecport.tokenize.corpus import InputError, read_inputs

    (tmp_path / "m.txt").write_text("# nothing yet\n\n")
    (tmp_path / "m.jsonl").write_text("")
    (tmp_path / "m.csv").write_text("path,id\n")
    for name in ("m.txt", "m.jsonl", "m.csv"):
        with pytest.raises(InputError, match=f"{name}: lists no file"):
            read_inputs([str(tmp_path / name)])


def test_a_manifest_may_begin_with_a_byte_order_mark(tmp_path):
    """As Excel's "CSV UTF-8" and Notepad write them: the mark is not part of the first name."""
    from codecport.tokenize.corpus import read_inputs

    (tmp_path / "a.wav").write_bytes(b"")
    bom = "\ufeff"
    (tmp_path / "m.csv").write_text(f"{bom}path,id\na.wav,x\n", encoding="utf-8")
    (tmp_path / "m.txt").write_text(f"{bom}a.wav\n", encoding="utf-8")
    (tmp_path / "m.jsonl").write_text(f'{bom}{{"path": "a.wav"}}\n', encoding="utf-8")
    for name in ("m.csv", "m.txt", "m.jsonl"):
        (item,) = read_inputs([str(tmp_path / name)])
        assert item.path == str(tmp_path / "a.wav") and item.id in ("x", "a.wav"), (name, item)


def test_export_batch_is_checked_before_exporting(tmp_path):
    # The command's contract, in this process (cli_support): a process of its own spent its time
    # importing torch.
    proc = invoke("codec-export", JOB, "--preset", "tiny", "--random-init", "--len", "4000", "--batch", "4",
                  "--precision", "fp16", "-o", tmp_path / "x")
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
            want = codec.encode(x, sr).arrays  # every time scale (SNAC's three)
            assert all(np.array_equal(a, b) for a, b in zip(got[i].arrays, want, strict=True)), (count, i)
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
    clips = [(0.2 * rng.standard_normal((1, int(0.05 * sr)))).astype(np.float32)
             for _ in range(2 * SMOKE_BATCH + 1)]
    codec.graph = FailingSecondCall
    try:
        batcher = Batcher(codec, SMOKE_BATCH)
        done = [r for i, x in enumerate(clips)
                for r in batcher.add(i, codec.window_plan(ArraySource(x, sr), None))]
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
        emit(result_table(settings.facts(), todo,
                          {i.id: CodecportError("no GPU on this worker") for i in todo}))

    monkeypatch.setattr(local, "run_local", workers_elsewhere)
    summary = run([str(corpus)], smoke_exports[JOB], tmp_path / "out", provider="cuda")
    assert seen["provider"] == "cuda" and summary.failed == len(files) and summary.done == 0
    errors = pq.read_table(tmp_path / "out" / "__errors__" / "errors.parquet").to_pylist()
    assert {e["error"] for e in errors} == {"no GPU on this worker"}
