"""`codec-run tokenize --engine ray`: a private local cluster whose job is SIGKILLed midway and
resumed, and a real two-node cluster started on 127.0.0.1 (one CPU each), attached to with
--address, on which an actor is killed midway. Codes must equal `encode` file by file, every
input once, and no Ray daemon may outlive its cluster.

Every Ray job start costs tens of seconds on two cores (a private cluster's daemons, or a driver
attached to the cluster, and its actors' sessions), so each job here checks all it can: three
job starts and one cluster in all.

Every cluster stays on loopback: the tests run in a private network namespace (unshare -n,
where loopback is the only interface; `loopback_only` fails them elsewhere), since Ray binds the
machine's routable address even when told 127.0.0.1.

Each driver and node is started in a session of its own (start_new_session): Ray's daemons and
workers stay in the session of the process that started them, so the processes a check looks at
are this test's, whatever other Ray clusters the machine runs (another test run, a bench)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from serve_support import RawSocket, chunks, frame_chunks, in_thread, ref_decode, ref_encode, run, until
from support import noise
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

import codecport
from codecport.serve import Result, ServeError, connect, stream

WINDOWED = "snac"  # the two-node cluster's codec: its long clips go through batched windows
RAY = str(BIN / "ray")
PLUGIN = Path(__file__).parent / "plugin"  # the toy codec (a plugin), which the last deployment serves
# No usage report, no dashboard; the nodes' logs stay in Ray's own temp folder. A killed proxy is
# found and replaced in seconds (Serve's default health check is every 10 s). Every process of
# the cluster finds the toy codec, as a plugin installed on every node would be.
ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGIN), os.environ.get("PYTHONPATH")]))}

pytestmark = pytest.mark.ray


@pytest.fixture(autouse=True, scope="module")
def loopback_only():
    """Ray binds its services to the machine's routable address whatever it is told (see
    shared/reference/ray-serve.md), so its clusters run only in a network namespace whose one
    interface is loopback: scripts/test.sh runs the suite under `unshare -n`."""
    others = sorted(name for _, name in socket.if_nameindex() if name != "lo")
    if others:
        pytest.fail(f"Ray tests run in a private network namespace, but {', '.join(others)} is here: run "
                    "them as scripts/test.sh does (unshare -n, loopback up)", pytrace=False)


def _processes(sessions) -> dict[int, bytes]:
    """pid -> command line of the live processes (zombies left out) of the Linux `sessions`."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) in sessions and fields[0] != "Z":
                out[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
    return out


def _ray_daemons(sessions) -> set[int]:
    """Ray's daemons (raylet, gcs_server) of `sessions` running now."""
    return {pid for pid, cmd in _processes(sessions).items() if b"raylet" in cmd or b"gcs_server" in cmd}


def _actors(sessions, name: bytes = b"MapWorker") -> set[int]:
    """The processes of `sessions` running now that run the Ray actor `name` (`ray::NAME...`; by
    default Ray Data's map actors)."""
    return {pid for pid, cmd in _processes(sessions).items() if name in cmd}


def _start(args, env=None) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "codec-run"), "tokenize", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **ENV, **(env or {})})


def _wait(proc: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    """stdout and stderr of a `_start`ed run once it ends; past `timeout`, its process group is
    SIGKILLed first (it fails its test then, on its return code)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()


def test_private_cluster_sigkilled_midway_then_resumed(tmp_path, smoke_exports):
    # Mimi here and SNAC on the two-node cluster: both kinds of batch on Ray (SNAC's windows;
    # Mimi's padded clips and its streamed long ones). test_tokenize runs every codec, SNAC's
    # codes of several time scales included: the driver writes the rows for both engines.
    folder = smoke_exports["mimi"]
    corpus = tmp_path / "corpus"
    # Three tasks of 8 on one actor (20 clips and the 3 bad ones, which sort first). Ray Data hands
    # a task's rows on once the next task's are ready too, so the first rows are written when the
    # second task ends, and the kill must come while the third runs: its last clip, a 1.5 s one
    # (Mimi streams it, a frame a call), keeps it running a second or more. The other clips are
    # short (half of them under the fixed graphs, padded into batches; the rest streamed).
    files = make_corpus(corpus, 19, seed=6, max_s=0.2, short_every=2)
    files.append(corpus / "spk2" / "long.wav")  # sorts last
    t = np.arange(int(1.5 * 24000)) / 24000
    sf.write(files[-1], (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 24000)
    bad = add_bad_files(corpus)
    out = tmp_path / "out"
    proc = _start([corpus, "-m", folder, "-o", out, "--engine", "ray", "--workers", "1", "--shard-rows", "1"])
    cluster: set[int] = set()  # its daemons, seen just before the kill

    def written() -> bool:
        if not list(out.glob("part-*.parquet")):
            return False
        cluster.update(_ray_daemons({proc.pid}))
        return True

    kill_when(proc, written)
    assert cluster, "the job's private cluster was not seen in its session"
    partial = rows(out)
    assert 0 < len(partial) < len(files)
    deadline = time.monotonic() + 30  # the killed driver's private cluster goes with it
    while _ray_daemons({proc.pid}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _ray_daemons({proc.pid}), "the killed job's cluster is still running"
    # Resumed on one actor: a second one would cost a process and its sessions, and tests nothing
    # the two-node job's two actors do not.
    proc = _start([corpus, "-m", folder, "-o", out, "--engine", "ray", "--workers", "1"])
    stdout, stderr = _wait(proc)
    assert proc.returncode == 0 and "Traceback" not in stderr, stdout + stderr
    assert f"{len(files) - len(partial)} files tokenized" in stdout and f"{len(bad)} failed" in stdout
    assert "core_worker" not in stderr and "WARNING" not in stderr, stderr
    want = reference_levels(folder, {p.relative_to(corpus).as_posix(): p for p in files})
    assert_codes(rows(out), want)
    for ident in partial:  # the rows written before the kill were kept, not redone
        assert np.array_equal(np.array(partial[ident]["codes"]), want[ident][0])
    errors = pq.read_table(out / "__errors__" / "errors.parquet").column("id").to_pylist()
    assert set(errors) == set(bad)
    assert not _ray_daemons({proc.pid}), "the private cluster outlived the job"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(sessions) -> None:
    """SIGKILL every process of `sessions` (the nodes' daemons and workers) until none is left."""
    deadline = time.monotonic() + 30
    while (left := _processes(sessions)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _node(address: str | None, port: int, env: dict) -> int:
    """A Ray node of one CPU on 127.0.0.1 (the head if `address` is None), started in a session of
    its own: the session's id (its processes')."""
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    where = ["--head", "--port", str(port), "--include-dashboard", "false"] if address is None else \
        ["--address", address]
    start = subprocess.Popen([RAY, "start", *where, *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, start_new_session=True)
    stdout, stderr = start.communicate(timeout=120)
    assert start.returncode == 0, stdout + stderr
    return start.pid


def _cpus_registered(address: str, env: dict) -> None:
    deadline = time.monotonic() + 60
    while True:  # the nodes registered: the cluster has their CPUs (at once, as a rule)
        status = subprocess.run([RAY, "status", "--address", address], check=False,
                                capture_output=True, text=True, timeout=60, env=env).stdout
        if "/2.0 CPU" in status:
            return
        assert time.monotonic() < deadline, status
        time.sleep(1)


@pytest.fixture(scope="module")
def wedge(tmp_path_factory) -> Path:
    """The file whose presence holds every step of the toy codec's decoder (a hung ONNX Runtime
    call, as a replica sees one): TOYCODEC_WEDGE in the cluster's environment names it."""
    return tmp_path_factory.mktemp("wedge") / "wedged"


@pytest.fixture(scope="module")
def cluster(wedge):
    """Two Ray nodes on 127.0.0.1, one CPU each: (address, env, the nodes' sessions, head's first),
    stopped at the end, pass or fail."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # The nodes and the jobs share a token (Ray's token auth, which `ray start` turns on).
    auth = {**ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "TOYCODEC_WEDGE": str(wedge)}
    env = {**os.environ, **auth}
    sessions: list[int] = []  # a node's processes stay in the session of its `ray start` (head first)
    try:
        sessions.append(_node(None, port, env))
        sessions.append(_node(address, port, env))
        _cpus_registered(address, env)
        assert len(_ray_daemons(sessions)) == 3, _processes(sessions)  # a GCS and two raylets
        yield address, auth, sessions
    finally:  # what `ray stop --force` does, to these nodes only
        _kill(sessions)
    assert not _processes(sessions), "the cluster's processes outlived it"


def _cpu_ticks(pid: int) -> int:
    """CPU time (user + system, in clock ticks) of a process so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def test_two_node_cluster_an_actor_killed_midway_codes_equal_encode(tmp_path, smoke_exports, cluster):
    """One job on both nodes (--workers 2: an actor of one CPU on each), one of its actors
    SIGKILLed while it encodes, once the first rows are written. Ray Data runs its task again: the
    job succeeds, every file once with `encode`'s codes, and a rerun finds them all done. (Whether
    the task reruns on a restarted actor or on the other one is Ray's choice, and varies with the
    load: a replacement actor is not a claim here.)"""
    address, auth, nodes = cluster
    folder = smoke_exports[WINDOWED]
    corpus = tmp_path / "corpus"
    # Six tasks of 8 for two actors, each holding up to two: when the first rows are written
    # (after two tasks) four are left, so an actor killed then has more work than the task it runs.
    files = make_corpus(corpus, 48, seed=7, max_s=1.0)
    out = tmp_path / "out"
    proc = _start([corpus, "-m", folder, "-o", out, "--engine", "ray", "--address", address,
                   "--workers", "2", "--shard-rows", "1"], env=auth)
    t0 = time.monotonic()
    while not list(out.glob("part-*.parquet")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() - t0 < 120
        time.sleep(0.02)
    # The actor killed is one that is encoding (its CPU time grows), so a task is lost midway and
    # must be run again (killing an idle one might lose nothing). The premise is checked, not
    # hoped for: the victim is one seen working in two looks in a row, killed as the second ends;
    # the test fails if no actor is seen so within a minute.
    deadline, victim = time.monotonic() + 60, None
    while victim is None:
        assert proc.poll() is None and time.monotonic() < deadline, "no actor was seen encoding"
        before = {pid: _cpu_ticks(pid) for pid in _actors(nodes)}
        time.sleep(0.2)
        middle = {pid: _cpu_ticks(pid) for pid in before}
        time.sleep(0.1)
        busy = {pid: _cpu_ticks(pid) - middle[pid] for pid in before if middle[pid] - before[pid] >= 2}
        victim = max((pid for pid in busy if busy[pid] >= 1), key=busy.get, default=None)
    os.kill(victim, signal.SIGKILL)
    stdout, err = _wait(proc, 300)
    assert proc.returncode == 0, err
    assert f"{len(files)} files tokenized" in stdout, stdout
    assert_codes(rows(out), reference(folder, {p.relative_to(corpus).as_posix(): p for p in files}))
    # Nothing to do: the driver says so without starting a Ray job (driver.py).
    proc = tokenize(corpus, "-m", folder, "-o", out, "--engine", "ray", "--address", address, env=auth)
    assert f"{len(files)} already done" in proc.stdout and "0 files tokenized" in proc.stdout


# ---- codec-serve --engine ray --------------------------------------------------------------------
class ServeOnRay:
    """A `codec-serve --engine ray` driver (its own session), the URL it printed, and its lines."""

    def __init__(self, folder: Path, log: Path, *args, env=None):
        self.log, self.lines, self.said = log, queue.Queue(), []
        with open(log, "w") as err:
            self.proc = subprocess.Popen([str(BIN / "codec-serve"), "-m", str(folder), "--engine", "ray",
                                          "--port", "0", *map(str, args)], stdout=subprocess.PIPE,
                                         stderr=err, start_new_session=True, text=True,
                                         env={**os.environ, **ENV, **(env or {})})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        line = self.expect("listening on", 180)
        self.url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line).group(1)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, text: str, timeout: float = 60) -> str:
        """The next line holding `text` that it prints (AssertionError if it exits or is silent
        for `timeout` s first)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"codec-serve --engine ray never said {text!r}: "
                                     f"{self.log.read_text()}") from None
            assert line is not None, f"codec-serve --engine ray ended before {text!r}: {self.log.read_text()}"
            self.said.append(line)
            if text in line:
                return line

    def get(self, path: str, headers: dict | None = None) -> tuple[int, object]:
        async def go():
            async with aiohttp.ClientSession() as s, s.get(self.url + path, headers=headers) as r:
                body = await r.json() if r.content_type == "application/json" else await r.text()
                return r.status, body
        return in_thread(asyncio.run, go())

    def stop(self, timeout: float = 60) -> tuple[int, str]:
        """SIGTERM (unless it has exited), then its exit status and all it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.reader.join()
        while not self.lines.empty():
            if (line := self.lines.get()) is not None:
                self.said.append(line)
        return self.proc.returncode, "".join(self.said)


def _serve_args(address: str, cpus: float) -> list:
    # A slow reader shows after a few hundred kilobytes: 128 KiB of backlog, 32 KiB unacknowledged
    # in the proxy (the streams that read keep neither anywhere near).
    return ["--address", address, "--replicas", 2, "--replica-cpus", cpus, "--proxies", "head", "--slots", 2,
            "--queue", 2, "--queue-timeout", 3, "--grace", 3, "--max-backlog", 1 << 17,
            "--send-buffer", 1 << 15]


@pytest.fixture(scope="module")
def mimi_on_ray(cluster, tiny_mimi_export, tmp_path_factory):
    """Tiny Mimi on two replicas of the two-node cluster (0.6 of a CPU each: one a node, as two
    do not fit on one, whichever node Serve starts a replacement on), 2 slots a side each, a queue
    of 2 waiting at most 3 s, behind one proxy (the head's: which proxy a stream went through is
    then known)."""
    address, auth, _ = cluster
    served = ServeOnRay(tiny_mimi_export, tmp_path_factory.mktemp("serve-ray") / "mimi.log",
                        *_serve_args(address, 0.6), env=auth)
    yield served
    served.stop()


async def _health(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
        return await r.json()


def _replicas(served: ServeOnRay, n: int, gone: int | None = None) -> list[dict]:
    """/health's replicas, once it lists `n`, and not the process `gone` (a replacement takes
    seconds to start; a dead replica is listed until its last report is 2 s old)."""
    async def listed():
        replicas = (await _health(served.url))["detail"]
        return len(replicas) == n and gone not in {r["pid"] for r in replicas}

    run(until(listed, f"/health never listed {n} replicas", timeout=60))
    return run(_health(served.url))["detail"]


async def _held_by(url: str, n: int) -> bool:
    return sum((await _active(url)).values()) == n


def test_streams_on_two_replicas_are_each_exact_and_health_sees_both(mimi_on_ray, tiny_mimi_export):
    """Streams that join and leave at staggered times, spread over the two replicas by Serve's
    proxy, give stream by stream what the runtime's streams give alone (Mimi duplex, encode and
    decode); /health lists each replica with its node and process, /metrics labels each one's."""
    replicas = _replicas(mimi_on_ray, 2)
    assert len({r["node"] for r in replicas}) == 2 and all(r["pid"] > 0 for r in replicas)
    assert all(r["slots"] == {"total": 2, "active": 0} for r in replicas)
    codec = codecport.load(tiny_mimi_export)
    rng = np.random.default_rng(5)
    xs = [noise(int(rng.integers(1500, 5000)), seed=20 + i)[0] for i in range(4)]
    cs = [rng.integers(0, codec.codebook_size, (4, int(rng.integers(40, 160)))) for _ in range(2)]

    async def duplex(i, client=None):
        await asyncio.sleep(0.1 * i)
        async with client or await connect(mimi_on_ray.url, "duplex", codebooks=2) as c:
            return await stream(c, chunks(xs[i], [700, 5, 1500]), interval=0.01)

    async def decoder(i):
        await asyncio.sleep(0.15 * i)
        async with await connect(mimi_on_ray.url, "decode", codebooks=4) as c:
            return await stream(c, frame_chunks(cs[i], [3, 11, 1]), interval=0.01)

    async def leaver():
        c = await connect(mimi_on_ray.url, "encode")
        await c.send_pcm(xs[3][:900])
        await c.close()  # gone mid-stream, without an end

    async def go():
        # The first two are open together (each replica then holds one: new streams go to the
        # replica holding fewest); the rest come and go as they will.
        first = await connect(mimi_on_ray.url, "duplex", codebooks=2)
        await until(lambda: _held_by(mimi_on_ray.url, 1), "the first stream never showed on /health")
        second = await connect(mimi_on_ray.url, "duplex", codebooks=2)
        return await asyncio.gather(duplex(0, first), duplex(1, second), duplex(2),
                                    *[decoder(i) for i in range(2)], leaver())

    got = run(go())
    for i in range(3):
        codes = ref_encode(codec, xs[i], 2)
        assert np.array_equal(got[i].codes()[0], codes), i
        assert np.array_equal(got[i].audio(), ref_decode(codec, codes)), i
    for i in range(2):
        assert np.array_equal(got[3 + i].audio(), ref_decode(codec, cs[i])), i

    def opened(text: str) -> dict[str, float]:
        return {m.group(1): float(m.group(2)) for m in re.finditer(
            r'codec_serve_streams_total\{op="duplex",replica="([^"]+)"\} (\S+)', text)}

    async def counted() -> bool:
        async with aiohttp.ClientSession() as s, s.get(mimi_on_ray.url + "/metrics") as r:
            return sum(opened(await r.text()).values()) >= 3

    # /metrics is each replica's last report (a second apart): the one after the streams ended.
    run(until(counted, "/metrics never counted the three duplex streams"))
    status, text = mimi_on_ray.get("/metrics")
    assert status == 200 and len(opened(text)) == 2 and sum(opened(text).values()) == 3, text


def test_a_stream_no_replica_can_take_is_queued_then_told_busy(mimi_on_ray):
    """Four duplex streams fill both replicas' slots; a fifth is told it is queued, then busy after
    the queue's 3 s: never an upgrade that Serve holds without an answer."""
    async def go():
        held = [await connect(mimi_on_ray.url, "duplex") for _ in range(4)]
        try:
            fifth = await asyncio.to_thread(RawSocket, mimi_on_ray.url, {"op": "duplex"})
            t0 = time.monotonic()
            _, text = await asyncio.to_thread(fifth.recv)
            return fifth.info, json.loads(text), time.monotonic() - t0
        finally:
            for c in held:
                await c.close()

    queued, refused, waited = run(go())
    assert queued["op"] == "queued" and queued["position"] == 1 and queued["timeout"] == 3, queued
    assert refused["code"] == "busy" and "3 s" in refused["message"] and waited > 2, (refused, waited)


def test_a_foreign_host_or_page_is_refused(mimi_on_ray):
    status, body = mimi_on_ray.get("/health", headers={"Host": "evil.example:80"})
    assert status == 421 and body["code"] == "bad_request", body

    async def page():
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(mimi_on_ray.url + "/stream", headers={"Origin": "http://evil.example"})
            return e.value.status

    assert run(page()) == 403


async def _metric(url: str, name: str) -> float:
    """The sum over the replicas of a counter of /metrics (`codec_serve_NAME{...}`)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    found = re.findall(rf"^codec_serve_{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def _serving_pids(served: ServeOnRay, sessions) -> list[int]:
    """The head's proxy and every replica: what a stream's bytes pass through."""
    return [*_actors(sessions, b"ProxyActor"), *(r["pid"] for r in _replicas(served, 2))]


def test_a_flooding_client_is_slowed_and_the_proxy_and_replicas_hold_little(mimi_on_ray, cluster,
                                                                               tiny_mimi_export):
    """A client that sends PCM as fast as loopback takes it for 3 s, reading what comes back: the
    gate in Serve's proxy passes it on no faster than the replica's stream takes it, so TCP slows
    the client (without it the proxy reads gigabytes a minute into its queue, and the replica
    into its own), the proxy and the replicas grow by tens of megabytes at most, and a stream
    afterwards is exact. (codec-bench serve --flood measures the same on both engines.)"""
    _, _, sessions = cluster
    from codecport.bench.procs import rss_mb

    pids = _serving_pids(mimi_on_ray, sessions)
    base = rss_mb(pids)
    chunk = noise(16384, seed=70)[0].astype("<f4").tobytes()  # 64 KiB a message

    async def flood() -> tuple[int, float]:
        sent, peak = 0, base
        async with aiohttp.ClientSession() as s, s.ws_connect(mimi_on_ray.url + "/stream", compress=0) as ws:
            await ws.send_str(json.dumps({"op": "duplex", "codebooks": 2}))
            assert json.loads((await ws.receive()).data)["op"] == "ready"

            async def drain():
                async for _ in ws:
                    pass
            reader = asyncio.ensure_future(drain())
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 3
            while (left := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(ws.send_bytes(chunk), left)
                except asyncio.TimeoutError:
                    break
                sent += len(chunk)
                if sent % (16 * len(chunk)) == 0:
                    peak = max(peak, rss_mb(pids))
            peak = max(peak, rss_mb(pids))
            reader.cancel()
        return sent, peak

    sent, peak = run(flood())
    assert sent < 64 << 20, f"{sent >> 20} MiB went in in 3 s: nothing slowed the client"
    assert peak - base < 150, f"the proxy and replicas grew from {base:.0f} to {peak:.0f} MiB"
    codec = codecport.load(tiny_mimi_export)
    x = noise(3000, seed=71)[0]

    async def good():
        async with await connect(mimi_on_ray.url, "duplex", codebooks=2) as c:
            return await stream(c, chunks(x, [1000]))

    got = run(good())
    codes = ref_encode(codec, x, 2)
    assert np.array_equal(got.codes()[0], codes) and np.array_equal(got.audio(), ref_decode(codec, codes))


def test_a_message_past_max_message_is_refused_in_the_proxy(mimi_on_ray, cluster):
    """A 15 MiB message (Serve's uvicorn takes up to 16) against --max-message 1 MiB: the client is
    told too_large and closed with 1009 by the gate, in the proxy; the replicas never hold the
    message (their memory stays where it was), and they count the refusal."""
    _, _, sessions = cluster
    from codecport.bench.procs import rss_mb

    replicas = [r["pid"] for r in _replicas(mimi_on_ray, 2)]
    before, counted = rss_mb(replicas), run(_metric(mimi_on_ray.url, 'errors_total'))
    big = noise(15 << 18, seed=72)[0].astype("<f4").tobytes()
    client = RawSocket(mimi_on_ray.url, {"op": "encode"})
    client.send(big)
    _, texts, close = client.rest()
    grown = rss_mb(replicas) - before
    assert close == 1009 and texts[-1]["code"] == "too_large" and "1048576" in texts[-1]["message"], texts
    assert grown < 8, f"the replicas grew by {grown:.0f} MiB: the message reached them"
    run(until(lambda: _metric_above(mimi_on_ray.url, "errors_total", counted), "the refusal was not counted"))


async def _metric_above(url: str, name: str, value: float) -> bool:
    return await _metric(url, name) > value


def test_a_slow_reader_is_dropped_behind_as_on_the_local_server(mimi_on_ray, tiny_mimi_export):
    """A decode stream whose client reads nothing (a 4 KiB receive buffer): once the output the
    gate has not seen taken passes --send-buffer, the replica's sends wait, its backlog passes
    --max-backlog, and the client is dropped with `behind`, as the local server drops it."""
    size = codecport.load(tiny_mimi_export).codebook_size
    codes = np.random.default_rng(73).integers(0, size, (4, 20000))
    dropped = RawSocket(mimi_on_ray.url, {"op": "decode"})
    for i in range(0, codes.shape[1], 2000):
        dropped.send(codes[:, i:i + 2000].astype("<i4").tobytes())
    run(until(lambda: _metric_above(mimi_on_ray.url, "drops_total", 0), "the slow reader was never dropped"))
    _, texts, close = dropped.rest()
    assert close == 1008 and texts[-1]["code"] == "behind" and "read faster" in texts[-1]["message"], texts


async def _paused(client, first: list, rest: list, go: asyncio.Event, result: Result) -> Result:
    """A whole stream whose `rest` is sent once `go` is set: everything it gave, in `result`."""
    async def chunks():
        for chunk in first:
            yield chunk
        await go.wait()
        for chunk in rest:
            yield chunk

    return await stream(client, chunks(), result=result)


async def _active(url: str) -> dict[int, int]:
    """pid -> streams held, of each replica /health lists."""
    return {r["pid"]: r["slots"]["active"] for r in (await _health(url))["detail"]}


async def _fault_under_two_streams(url: str, xs: list, fault) -> tuple[int, list, Result]:
    """Two duplex streams of `xs[0]` and `xs[1]`, one on each replica, halfway sent and each
    having given output; then `fault(pid of the first stream's replica)`, a stream of `xs[2]` from
    start to end, and the first two's rest. Returns (that pid, the two streams' outcomes, each a
    Result or the error that ended it, the third stream's Result)."""
    resume = asyncio.Event()
    # The earlier tests' streams may still count on /health (a replica reports each second):
    # the first stream's replica is the one holding a stream only once none is held before.
    await until(lambda: _held_by(url, 0), "the earlier streams' slots never came back")
    a = await connect(url, "duplex", codebooks=2)
    await until(lambda: _held_by(url, 1), "the first stream never showed on /health")
    first = next(pid for pid, n in (await _active(url)).items() if n == 1)
    b = await connect(url, "duplex", codebooks=2)
    await until(lambda: _held_by(url, 2), "the second stream never showed on /health")
    assert set((await _active(url)).values()) == {1}  # one stream on each replica
    results = [Result(a.info), Result(b.info)]
    streams = [asyncio.ensure_future(_paused(c, chunks(x[:2400], [700, 900]), chunks(x[2400:], [800]),
                                             resume, r)) for c, x, r in zip((a, b), xs, results)]
    await until(lambda: all(r.pieces for r in results), "nothing came before the fault")
    fault(first)
    async with await connect(url, "duplex", codebooks=2, timeout=30) as c:
        fresh = await stream(c, chunks(xs[2], [1000]), interval=0.01)
    resume.set()
    outcomes = await asyncio.gather(*streams, return_exceptions=True)
    for c in (a, b):
        await c.close()
    return first, outcomes, fresh


def test_a_replica_killed_mid_stream(mimi_on_ray, tiny_mimi_export):
    """Two duplex streams, one on each replica; the one replica's process is SIGKILLed midway.
    Its client is told the replica died (not a bare 1006), the other stream goes on bit-exact,
    a new stream goes to the live replica at once, and Serve replaces the dead one."""
    url = mimi_on_ray.url
    _replicas(mimi_on_ray, 2)
    codec = codecport.load(tiny_mimi_export)
    xs = [noise(4800, seed=40 + i)[0] for i in range(3)]

    def kill(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    victim, (lost, kept), fresh = run(_fault_under_two_streams(url, xs, kill))
    assert isinstance(lost, ServeError) and lost.code == "closed" and "died" in str(lost), lost
    for got, x in ((kept, xs[1]), (fresh, xs[2])):
        codes = ref_encode(codec, x, 2)
        assert np.array_equal(got.codes()[0], codes)
        assert np.array_equal(got.audio(), ref_decode(codec, codes))
    _replicas(mimi_on_ray, 2, gone=victim)  # replaced


def test_the_proxy_killed_then_replaced(mimi_on_ray, cluster, tiny_mimi_export):
    """The proxy's process SIGKILLed under a live stream: the client is told its stream is lost,
    and once Serve has started another proxy on the port, new streams are exact."""
    _, _, sessions = cluster
    url = mimi_on_ray.url
    (proxy,) = _actors(sessions, b"ProxyActor")
    codec = codecport.load(tiny_mimi_export)
    x = noise(3000, seed=50)[0]

    async def go():
        result, resume = None, asyncio.Event()
        async with await connect(url, "duplex", codebooks=2) as c:
            result = Result(c.info)
            task = asyncio.ensure_future(_paused(c, chunks(x, [700]), [], resume, result))
            await until(lambda: result.pieces, "nothing came before the kill")
            os.kill(proxy, signal.SIGKILL)
            lost = (await asyncio.gather(task, return_exceptions=True))[0]

        async def served() -> bool:
            with contextlib.suppress(ServeError):
                async with await connect(url, "duplex", codebooks=2) as c:
                    return await stream(c, chunks(x, [1000]))
            return False

        fresh = None

        async def back() -> bool:
            nonlocal fresh
            fresh = await served()
            return bool(fresh)

        await until(back, "no proxy served after the kill", timeout=90)
        return lost, fresh

    lost, fresh = run(go())
    assert isinstance(lost, ServeError) and lost.code == "closed" and "died" in str(lost), lost
    codes = ref_encode(codec, x, 2)
    assert np.array_equal(fresh.codes()[0], codes) and np.array_equal(fresh.audio(), ref_decode(codec, codes))
    assert _actors(sessions, b"ProxyActor") - {proxy}


def test_a_node_lost(mimi_on_ray, cluster, tiny_mimi_export):
    """The second node's processes all SIGKILLed (its raylet, its replica) under two streams, one
    on each node's replica: the lost node's client is told its stream is lost, the head's stream
    goes on exact, and a new stream goes to the head's replica at once. (The lost replica is not
    started again: the head has no room for a second of 0.6 of a CPU.)"""
    _, _, sessions = cluster
    url = mimi_on_ray.url
    codec = codecport.load(tiny_mimi_export)
    xs = [noise(4800, seed=90 + i)[0] for i in range(3)]
    replicas = _replicas(mimi_on_ray, 2)
    second = set(_processes(sessions[1:]))
    assert len({r["pid"] in second for r in replicas}) == 2, replicas  # one replica a node
    first, outcomes, fresh = run(_fault_under_two_streams(url, xs, lambda _: _kill(sessions[1:])))
    gone, kept = (0, 1) if first in second else (1, 0)
    lost = outcomes[gone]
    assert isinstance(lost, ServeError) and lost.code == "closed" and "died" in str(lost), outcomes
    for got, x in ((outcomes[kept], xs[kept]), (fresh, xs[2])):
        codes = ref_encode(codec, x, 2)
        assert np.array_equal(got.codes()[0], codes) and np.array_equal(got.audio(), ref_decode(codec, codes))


# ---- a redeploy, autoscaling, routing by slots, a wedged replica, SIGTERM: the toy codec ---------
@pytest.fixture(scope="module")
def toy_export(tmp_path_factory) -> Path:
    """The toy codec (tests/plugin: a decoder of 2 codebooks of 64, 80 samples a frame at 8 kHz,
    one frame a step) exported with random weights, by a codec-export that finds the plugin."""
    work = tmp_path_factory.mktemp("toy")
    proc = subprocess.run([str(BIN / "codec-export"), "toy", "--random-init", "--seed", "3", "--len", "4000",
                           "-o", "model"], cwd=work, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ENV["PYTHONPATH"]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work / "model"


def _toy_reference(folder: Path, codes: list[np.ndarray]) -> list[np.ndarray]:
    """What the toy runtime's own decoder stream gives for each of `codes`, computed in a process
    that sees the plugin (this one must not: test_external_codec checks it does not)."""
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "in.npz", **{f"c{i:03d}": c for i, c in enumerate(codes)})
        script = ("import sys, numpy as np, codecport\nc = codecport.load(sys.argv[1])\n"
                  "z = np.load(sys.argv[2])\n"
                  "np.savez(sys.argv[3], **{k: c.decoder_stream().push(z[k]) for k in z.files})")
        subprocess.run([str(BIN / "python"), "-c", script, str(folder), f"{tmp}/in.npz", f"{tmp}/out.npz"],
                       check=True, timeout=120, env={**os.environ, "PYTHONPATH": ENV["PYTHONPATH"]})
        out = np.load(f"{tmp}/out.npz")
        return [out[f"c{i:03d}"] for i in range(len(codes))]


@pytest.fixture(scope="module")
def redeployed(mimi_on_ray, cluster, tiny_mimi_export, toy_export, tmp_path_factory):
    """A redeploy while Mimi streams run: `codec-serve --engine ray` with the toy codec on the same
    cluster (its head alone, since the node-loss test), autoscaled from 1 to 3 replicas of 0.3 of
    a CPU (up after 1 s of need, down after 3 s of less), one slot each and a queue of one, behind
    the head's proxy. Yields (the toy's driver, the Mimi stream that ended after the redeploy
    began, the one that never ended, the Mimi driver's exit status and lines)."""
    address, auth, _ = cluster
    url = mimi_on_ray.url
    _replicas(mimi_on_ray, 1)
    xs = [noise(4000, seed=60 + i)[0] for i in range(2)]
    started: list[ServeOnRay] = []

    async def go():
        resume, never = asyncio.Event(), asyncio.Event()
        clients = [await connect(url, "duplex", codebooks=2) for _ in range(2)]
        results = [Result(c.info) for c in clients]
        streams = [asyncio.ensure_future(_paused(clients[0], chunks(xs[0][:2000], [700]),
                                                 chunks(xs[0][2000:], [700]), resume, results[0])),
                   asyncio.ensure_future(_paused(clients[1], chunks(xs[1][:2000], [700]), [], never,
                                                 results[1]))]
        await until(lambda: results[0].pieces and results[1].pieces, "nothing came before the redeploy")
        driver = asyncio.ensure_future(asyncio.to_thread(
            ServeOnRay, toy_export, tmp_path_factory.mktemp("serve-ray") / "toy.log", "--address", address,
            "--autoscale", "1:3:3", "--replica-cpus", 0.3, "--proxies", "head", "--slots", 1, "--queue", 1,
            "--queue-timeout", 20, "--grace", 3, env=auth))
        driver.add_done_callback(lambda t: t.exception() or started.append(t.result()))

        async def draining() -> bool:
            return any(r["draining"] for r in (await _health(url))["detail"])

        await until(draining, "no Mimi replica was told it is being stopped", timeout=120)
        resume.set()  # within the old replica's grace: this one ends on it
        ended, cut = await asyncio.gather(*streams, return_exceptions=True)
        for c in clients:
            await c.close()
        await driver
        return ended, cut

    try:
        ended, cut = run(go())
        status, said = mimi_on_ray.stop()
        yield started[0], (ended, xs[0]), cut, status, said
    finally:
        for driver in started:
            driver.stop()


@pytest.fixture(scope="module")
def toy_on_ray(redeployed) -> ServeOnRay:
    return redeployed[0]


def test_a_redeploy_lets_old_streams_finish_and_serves_the_new_model(redeployed, tiny_mimi_export,
                                                                      toy_export):
    """Old streams finish on the old replicas (Mimi, exact) within --grace, those still running
    then are told shutting_down, new streams get the new model (the toy's decode, exact), and the
    old driver sees itself replaced and leaves."""
    toy, (ended, x), cut, status, said = redeployed
    mimi = codecport.load(tiny_mimi_export)
    codes = ref_encode(mimi, x, 2)
    assert not isinstance(ended, BaseException), ended
    assert np.array_equal(ended.codes()[0], codes) and np.array_equal(ended.audio(), ref_decode(mimi, codes))
    assert isinstance(cut, ServeError) and cut.code == "shutting_down", cut
    assert status == 0 and "replaced:" in said and "draining" not in said, said
    cs = np.random.default_rng(8).integers(0, 64, (2, 23))

    async def go():
        async with await connect(toy.url, "decode", timeout=60) as c:
            return await stream(c, frame_chunks(cs, [4, 100]), interval=0.01)

    got = run(go())
    assert np.array_equal(got.audio(), _toy_reference(toy_export, [cs])[0])
    assert {r["codec"] for r in _replicas(toy, 1)} == {"toy"}


async def _serving(url: str, n: int) -> bool:
    """/health lists `n` replicas, each one Serve routes streams to."""
    health = await _health(url)
    return health["replicas"] == n and health["serving"] == n


def test_autoscaling_grows_routes_by_slots_and_shrinks_cutting_no_stream(toy_on_ray, toy_export):
    """Streams arrive one by one on a deployment of 1 to 3 replicas of one slot: each is served at
    once, and the replicas grow to 3 (each replica's slots in use ask for one more, up to MAX).
    Then three streams at once, three rounds: each goes to a replica with its slot free (one a
    replica, none queued, none refused: the router asks every replica, where Serve's picks two at
    random), each exact. Then the deployment idles with one stream held midway: the replicas
    shrink; the one holding the stream, if Serve stops it, lets it finish within --grace (exact);
    once it ends the deployment is back at one replica."""
    url = toy_on_ray.url
    rng = np.random.default_rng(80)
    cs = [rng.integers(0, 64, (2, int(rng.integers(20, 50)))) for _ in range(13)]

    async def go():
        held, rounds = [], []
        for n in (1, 2, 3):
            await until(lambda n=n: _serving(url, n), f"autoscaling never reached {n} replicas", timeout=120)
            held.append(await connect(url, "decode", timeout=60))
            await until(lambda n=n: _held_by(url, n), f"stream {n} never showed on /health")
        grown = sorted((await _active(url)).values())
        first = await asyncio.gather(*(stream(c, frame_chunks(cs[i], [7, 100])) for i, c in enumerate(held)))
        for c in held:
            await c.close()
        for r in range(3):
            await until(lambda: _held_by(url, 0), "the streams' slots never came back")
            clients = await asyncio.gather(*(connect(url, "decode") for _ in range(3)))
            await until(lambda: _held_by(url, 3), "a round's streams never showed on /health")
            spread = sorted((await _active(url)).values())
            got = await asyncio.gather(*(stream(c, frame_chunks(cs[3 + 3 * r + i], [5, 100]))
                                         for i, c in enumerate(clients)))
            rounds.append((spread, [c.queued for c in clients], got))
            for c in clients:
                await c.close()
        resume = asyncio.Event()
        async with await connect(url, "decode") as c:
            kept = Result(c.info)
            task = asyncio.ensure_future(_paused(c, [cs[12][:, :10]], [cs[12][:, 10:]], resume, kept))
            await until(lambda: kept.pieces, "nothing came before the idle time")

            async def fewer() -> bool:
                health = await _health(url)
                return health["serving"] < 3 or any(r["draining"] for r in health["detail"])

            await until(fewer, "the replicas never shrank", timeout=60)
            resume.set()
            await task
        await until(lambda: _serving(url, 1), "the replicas never came back to one", timeout=90)
        return grown, first, rounds, kept

    grown, first, rounds, kept = run(go())
    want = _toy_reference(toy_export, cs)
    assert grown == [1, 1, 1], grown
    for i, got in enumerate(first):
        assert np.array_equal(got.audio(), want[i]), i
    for r, (spread, queued, got) in enumerate(rounds):
        assert spread == [1, 1, 1] and queued == [[], [], []], (r, spread, queued)
        for i in range(3):
            assert np.array_equal(got[i].audio(), want[3 + 3 * r + i]), (r, i)
    assert kept.done is not None and np.array_equal(kept.audio(), want[12])


def test_a_wedged_replica_tells_its_clients_and_is_replaced(toy_on_ray, wedge):
    """A step that never returns (the wedge file holds the toy decoder's steps): past the bound
    on a step (engine.STUCK_S), the replica ends its stream with an error that says so, fails
    Serve's health check, and Serve replaces it; the deployment serves again."""
    url = toy_on_ray.url
    codes = np.random.default_rng(81).integers(0, 64, (2, 30))

    async def go():
        async with await connect(url, "decode") as c:
            await until(lambda: _held_by(url, 1), "the stream never showed on /health")
            victim = next(pid for pid, n in (await _active(url)).items() if n == 1)
            await c.send_codes(codes)
            with pytest.raises(ServeError) as told:
                while await c.receive(timeout=60) is not None:
                    pass
        return victim, told.value

    wedge.touch()
    try:
        victim, told = run(go())
        said = str(told)
        assert told.code == "internal" and "has not returned" in said and "connect again" in said, told
        _replicas_without(toy_on_ray, victim)
    finally:
        wedge.unlink()


def _replicas_without(served: ServeOnRay, gone: int) -> None:
    async def replaced():
        detail = (await _health(served.url))["detail"]
        return gone not in {r["pid"] for r in detail} and len(detail) >= 1 and all(r["ok"] for r in detail)

    run(until(replaced, f"replica {gone} was never replaced", timeout=90))


def test_sigterm_drains_the_deployment(toy_on_ray, toy_export):
    """SIGTERM to the driver: it says it drains; a stream that ends within --grace ends exact, one
    still running then is told shutting_down; the driver deletes its deployment and exits 0."""
    url = toy_on_ray.url
    cs = [np.random.default_rng(82 + i).integers(0, 64, (2, 30)) for i in range(2)]

    async def go():
        resume, never = asyncio.Event(), asyncio.Event()
        # One slot a replica: the second stream comes once autoscaling has added a replica (a
        # stream queued before stays on its replica: docs/serve.md).
        clients = [await connect(url, "decode")]
        await until(lambda: _serving(url, 2), "autoscaling never added a replica", timeout=60)
        clients.append(await connect(url, "decode"))
        results = [Result(c.info) for c in clients]
        tasks = [asyncio.ensure_future(_paused(c, [codes[:, :10]], [codes[:, 10:]], gate, result))
                 for c, codes, gate, result in zip(clients, cs, (resume, never), results)]
        await until(lambda: all(r.pieces for r in results), "nothing came before the SIGTERM")
        toy_on_ray.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(toy_on_ray.expect, "draining")
        resume.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()
        return outcomes

    ended, cut = run(go())
    assert not isinstance(ended, BaseException), ended
    assert np.array_equal(ended.audio(), _toy_reference(toy_export, cs[:1])[0])
    assert isinstance(cut, ServeError) and cut.code == "shutting_down", cut
    status, said = toy_on_ray.stop()
    assert status == 0 and said.rstrip().endswith("stopped"), said


# ---- what is decided without a cluster ---------------------------------------------------------
def test_autoscaling_asks_for_the_full_replicas_and_one_with_room():
    from types import SimpleNamespace

    from codecport.serve.replica import slots_policy

    def wanted(**load):
        return slots_policy(SimpleNamespace(aggregated_metrics={"load": load}))[0]

    assert wanted() == 1  # nothing reported yet: the minimum Serve allows
    assert wanted(a=0.0, b=0.0) == 1  # idle: one replica with room
    assert wanted(a=0.5, b=0.5) == 2  # one replica's worth of streams, spread: that and one with room
    assert wanted(a=1.0, b=1.0) == 3  # both full: a third for the next stream
    assert wanted(a=1.0, b=1.0, c=0.25) == 3


def test_the_application_builder_parses_its_args_as_the_command_line(tmp_path):
    """`codecport.serve.onray:application` (a RayService's import_path) takes codec-serve's flags by
    their names through the command line's own parser: typed, normalised and checked as the CLI
    checks them (one origin as a string is one origin; a slot count of 0, a page that is not an
    origin, an unknown name or no model are refused in one line)."""
    from codecport.errors import CodecportError
    from codecport.serve.flags import parse_args
    from codecport.serve.onray import application

    config, plan = parse_args({"slots": "4", "grace": 3, "batched": "false", "replica_cpus": 2,
                               "allow_origin": "https://App.example:443", "autoscale": "1:3:45"})
    assert (config.slots, config.grace, config.batched, config.allow_origin) == (4, 3.0, False,
                                                                                ("https://app.example",))
    assert (plan.autoscale, plan.downscale, plan.cpus) == ((1, 3), 45.0, 2.0)
    config, _ = parse_args({"allow_origin": ["http://localhost:5173", "https://a.example"]})
    assert config.allow_origin == ("http://localhost:5173", "https://a.example")
    for bad, said in (({"slots": 0}, "--slots"), ({"allow_origin": "evil"}, "evil"),
                      ({"autoscale": "4:1"}, "MIN:MAX"), ({"replicas": 2, "autoscale": "1:3"}, "exclude"),
                      ({"slot": 2}, "unknown application arg 'slot'"), ({"address": "h:1"}, "address")):
        with pytest.raises(CodecportError, match=said):
            parse_args(bad)
    with pytest.raises(CodecportError, match="args.model"):
        application({"slots": 2})
    with pytest.raises(CodecportError, match="--slots"):
        application({"model": str(tmp_path), "slots": -1})


def test_an_answer_of_serves_controller_in_another_shape_is_refused_saying_so():
    """Which replicas Serve stops is read from its controller's private answer through Serve's
    public schema: an answer of another shape (another Ray) is refused with a message that says
    what to do, never read as "nothing is stopping"."""
    from codecport.serve import controller

    with pytest.raises(controller.ShapeError, match="does not know.*pip install 'codecport\\[ray\\]'"):
        controller.parse({"applications": {"codec-serve": {"deployments": ["not", "a", "mapping"]}}})


def test_an_address_that_answers_but_is_not_ray_is_refused_at_once(tiny_mimi_export):
    """--address given a port that answers but is not Ray's GCS (a dashboard's HTTP, a service that
    says nothing): one line naming what to give, exit 1, within seconds (ray.init hung there,
    deaf to SIGTERM). The CLI on the HTTP port; the check itself on the silent one (its wait is
    the check's bound, 5 s in the CLI)."""
    import http.server

    from codecport.cluster import check_reachable
    from codecport.errors import CodecportError

    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with web, socket.create_server(("127.0.0.1", 0)) as silent:
        t0 = time.monotonic()
        proc = subprocess.run([str(BIN / "codec-serve"), "-m", str(tiny_mimi_export), "--engine", "ray",
                               "--address", f"127.0.0.1:{web.server_port}"], capture_output=True, text=True,
                              timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and "not as a Ray cluster" in lines[0], lines
        assert "GCS address" in lines[0] and "(it answered b'" in lines[0], lines
        assert time.monotonic() - t0 < 30
        web.shutdown()
        with pytest.raises(CodecportError, match="not as a Ray cluster .it said nothing in 0.5 s"):
            check_reachable(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)


def test_the_board_removes_itself_once_the_application_is_gone(monkeypatch):
    """Under a RayService no driver removes the board: it asks Serve's controller, and once the
    application it has seen is gone for three polls in a row it kills itself for good (a crash
    would be restarted). An application not seen yet (the board opened first) keeps it."""
    from types import SimpleNamespace

    from codecport.serve import controller, replica

    answers = iter([None, True, True, False, False, True, False, False, False])
    killed = []

    class Controller:
        class get_serve_instance_details:  # noqa: N801 (Ray's method, with its .remote)
            @staticmethod
            async def remote():
                return next(answers)

    def stops(present, app, deployment):
        if present is None:
            return controller.Stops(False, frozenset(), False)
        return controller.Stops(False, frozenset(), present)

    monkeypatch.setattr(replica, "PUSH", 0.001)
    monkeypatch.setattr(controller, "handle", lambda: Controller)
    monkeypatch.setattr(controller, "parse", lambda raw: raw)
    monkeypatch.setattr(controller, "stops", stops)
    monkeypatch.setattr(replica.ray, "kill", lambda actor, no_restart: killed.append((actor, no_restart)))
    monkeypatch.setattr(replica.ray, "get_runtime_context", lambda: SimpleNamespace(current_actor="board"))
    board = replica.Board()
    run(asyncio.wait_for(board._poll(), 10))
    # Not gone at the first absence (None: before the application existed), nor after two
    # absences in a row; gone at the third.
    assert killed == [("board", True)] and next(answers, "spent") == "spent"
