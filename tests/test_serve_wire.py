"""`codec-serve` at the socket, as a web page or a careless client meets it: a request must name
the server as its Host and a browser's WebSocket come from an allowed page (`--allow-origin`);
a client's frames must be masked (RFC 6455 section 5.1); a slow reader that keeps sending gets
its `behind` error before the socket goes. Every server here listens on 127.0.0.1 only."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request

import aiohttp
import numpy as np
import pytest
from click.testing import CliRunner
from serve_support import RawSocket, run, serving

import codecport
from codecport.cli.serve import serve_cli
from codecport.serve import ServeError, connect
from codecport.serve.config import ServeConfig
from codecport.serve.protocol import CLOSE_CODES

PAGE = "http://localhost:5173"


@pytest.fixture(scope="module")
def mimi(tiny_mimi_export, tmp_path_factory):
    with serving(tiny_mimi_export, tmp_path_factory.mktemp("serve") / "mimi.log", "--allow-origin", PAGE,
                 "--allow-origin", "https://App.Example:443/", "--max-backlog", 1 << 16,
                 "--send-buffer", 4096) as s:
        yield s


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _status(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


def _get(url: str, path: str, host: str) -> tuple[int, bytes]:
    """GET `path` on the server naming `host` as its Host: (status, body)."""
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return _status(head), body


def _handshake(url: str, **headers) -> tuple[int, bytes]:
    """The status of a WebSocket upgrade to /stream with `headers` (Origin, Host), and its body."""
    ws = RawSocket(url, None, timeout=30, headers=headers)
    with ws.sock:
        length = re.search(rb"(?im)^content-length: *(\d+)", ws.head)
        body = ws.buf
        while length and len(body) < int(length.group(1)):
            body += ws.sock.recv(65536)
        return _status(ws.head), body


def test_a_foreign_page_or_host_is_refused(mimi):
    """A browser's WebSocket from a page not allowed (--allow-origin) is refused before the
    upgrade (403), as is any request naming another Host (421: DNS rebinding), /health and
    /metrics too; the pages allowed, clients that send no Origin, and the loopback names with the
    server's port are served."""
    port = _port(mimi.url)
    assert _handshake(mimi.url)[0] == 101  # no Origin: not a browser
    for origin in (PAGE, "http://LOCALHOST:5173", "https://app.example"):
        assert _handshake(mimi.url, Origin=origin)[0] == 101, origin
    for origin in ("http://evil.example", "http://localhost:5174", "https://localhost:5173", "null",
                   f"http://127.0.0.1:{port}"):
        status, body = _handshake(mimi.url, Origin=origin)
        assert status == 403, origin
        error = json.loads(body)
        assert error["op"] == "error" and "--allow-origin" in error["message"], error
    for host in (f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}"):
        assert _handshake(mimi.url, Host=host)[0] == 101, host
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}",
                 f"localhost:{port}.evil.example", f"10.0.0.1:{port}"):
        assert _handshake(mimi.url, Host=host)[0] == 421, host
        assert _get(mimi.url, "/health", host)[0] == 421, host
    status, body = _get(mimi.url, "/metrics", f"evil.example:{port}")
    assert status == 421 and "localhost" in json.loads(body)["message"]
    assert _get(mimi.url, "/health", f"localhost:{port}")[0] == 200


def test_a_malformed_request_is_a_client_mistake_not_a_server_error(mimi):
    """Two Host headers (one naming another site): aiohttp answers 400 before any handler; the
    server's log holds no ERROR and no traceback for it (a client's mistake, told at INFO)."""
    port = _port(mimi.url)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example\r\n\r\n".encode())
        status = s.recv(200).split(b"\r\n", 1)[0]
    assert b" 400 " in status, status
    assert _get(mimi.url, "/health", f"127.0.0.1:{port}")[0] == 200  # the next request is served
    log = mimi.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_the_client_says_why_a_page_was_refused(mimi):
    async def go(origin: str):
        async with aiohttp.ClientSession(headers={"Origin": origin}) as session:
            c = await connect(mimi.url, "encode", session=session)
            await c.close()

    run(go(PAGE))
    with pytest.raises(ServeError, match="--allow-origin") as e:
        run(go("http://evil.example"))
    assert e.value.code == "bad_request"


def test_allow_origin_takes_origins_only(tiny_mimi_export):
    for bad in ("localhost:5173", "http://localhost:5173/page", "ftp://x.example", "http://"):
        r = CliRunner().invoke(serve_cli, ["-m", str(tiny_mimi_export), "--allow-origin", bad])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "http://localhost:5173" in r.stderr, r.stderr


def test_the_flags_default_to_the_config():
    """One source for the defaults: each flag's is ServeConfig's."""
    config = ServeConfig()
    params = {p.name: p for p in serve_cli.params}
    for name in ("slots", "host", "port", "queue", "queue_timeout", "idle_timeout", "handshake_timeout",
                 "grace", "max_message", "max_backlog", "send_buffer", "batched"):
        assert params[name].default == getattr(config, name), name


@pytest.mark.parametrize("first", [True, False])
def test_an_unmasked_frame_fails_the_connection(mimi, first):
    """RFC 6455 section 5.1: a server must close the connection on a client's frame that is not
    masked (aiohttp's reader takes it as data). The request itself, or input after it: a JSON
    error saying why, then close code 1002."""
    c = RawSocket(mimi.url, None, timeout=30)
    request = json.dumps({"op": "encode"})
    if first:
        c.send(request, masked=False)
    else:
        c.send(request)
        assert json.loads(c.recv()[1])["op"] == "ready"
        c.send(np.zeros(960, "<f4").tobytes(), masked=False)
    _, texts, close = c.rest()
    assert close == 1002 and texts[-1]["code"] == "bad_request" and "masked" in texts[-1]["message"], texts


def test_a_slow_reader_that_keeps_sending_gets_its_behind_error(mimi, tiny_mimi_export):
    """A client that sends all the time and reads nothing until it has been dropped (past
    --max-backlog) still gets its `behind` error and the close: the server reads and drops its
    input meanwhile, and closes once the client has had them (closed with the client's input
    unread, the kernel resets the connection and the client loses what it had not read; it did
    two times in five)."""
    codec = codecport.load(tiny_mimi_export)
    codes = np.random.default_rng(8).integers(0, codec.codebook_size, (4, 200)).astype("<i4").tobytes()

    def drops() -> float:
        text = urllib.request.urlopen(mimi.url + "/metrics", timeout=30).read().decode()
        return float(re.search(r"^codec_serve_drops_total (\S+)$", text, re.MULTILINE).group(1))

    for _ in range(4):
        before = drops()
        c = RawSocket(mimi.url, {"op": "decode"}, timeout=30)
        stop = threading.Event()

        def send(c=c, stop=stop) -> None:
            try:
                while not stop.is_set():
                    c.send(codes)
            except OSError:
                pass  # the server closed: what was sent after its close is nobody's

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        deadline = time.monotonic() + 60  # a bound on a hang, not a measured time
        while drops() == before:
            assert time.monotonic() < deadline, "never dropped"
            time.sleep(0.01)  # pacing the look, not a wait: the drop is what it waits for
        try:
            _, texts, close = c.rest()
        finally:
            stop.set()
            sender.join(30)
        assert close == CLOSE_CODES["behind"] and texts[-1]["code"] == "behind", texts
        assert "read faster" in texts[-1]["message"]
