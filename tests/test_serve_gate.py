"""codecport's gate in Ray Serve's proxy (serve/gate.py), between a stand-in for uvicorn (the
client's side) and one for Serve's proxy and replica: what it passes on, what it holds back until
the replica gives credit (so uvicorn stops reading the client), what it refuses by itself, and the
acknowledgements of output it hands the replica. The same gate under a real Serve proxy:
tests/test_ray.py (the flooding client, the message too large, the slow reader)."""

from __future__ import annotations

import asyncio
import json

from serve_support import run

from codecport.serve import gate

MAX = 1000
WINDOW = 2 * (MAX + gate.OVERHEAD)


class Sides:
    """uvicorn (the client's messages it would read, what the gate sends it) and the proxy (what
    it pulled through the gate) around one gate."""

    def __init__(self, path: str = "/stream", headers=()):
        self.client: asyncio.Queue = asyncio.Queue()
        self.to_client: list[dict] = []
        self.pulled: list[dict] = []
        self.scope: dict | None = None
        self.done = asyncio.Event()
        self.replica_send = None
        self.path, self.headers = path, list(headers)

    async def app(self, scope, receive, send):  # Serve's proxy and the replica behind it
        self.scope, self.replica_send = scope, send

        async def pull():
            while True:
                self.pulled.append(await receive())

        puller = asyncio.ensure_future(pull())
        await self.done.wait()
        puller.cancel()

    async def uvicorn_send(self, message):
        self.to_client.append(message)

    def start(self) -> asyncio.Task:
        scope = {"type": "websocket", "path": self.path, "headers": self.headers}
        return asyncio.ensure_future(gate.Gate(self.app)(scope, self.client.get, self.uvicorn_send))


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


async def accepted(window_out: int = 4096) -> tuple[Sides, asyncio.Task]:
    """A /stream WebSocket through the gate, accepted by a replica that told it its bounds."""
    sides = Sides()
    task = sides.start()
    await sides.client.put({"type": "websocket.connect"})
    await settle()
    await sides.replica_send({"type": "websocket.accept", gate.BOUNDS: {
        "max_message": MAX, "window": WINDOW, "window_out": window_out}})
    return sides, task


def binary(n: int) -> dict:
    return {"type": "websocket.receive", "bytes": b"x" * n}


def test_input_passes_within_the_window_and_waits_for_credit_beyond_it():
    async def go():
        sides, task = await accepted(4096)
        for _ in range(10):
            await sides.client.put(binary(900))
        await settle()
        held = len([m for m in sides.pulled if m["type"] == "websocket.receive"])
        unread = sides.client.qsize()
        await sides.replica_send({"type": gate.CREDIT, "bytes": 900 + gate.OVERHEAD})
        await settle()
        after = len([m for m in sides.pulled if m["type"] == "websocket.receive"])
        sides.done.set()
        await task
        return held, unread, after, sides.to_client

    held, unread, after, to_client = run(go())
    # Two of 1412 fit the window of 3024; the third waits (and uvicorn is asked for no fourth, so
    # it stops reading the socket: 7 left unread).
    assert (held, unread, after) == (2, 7, 3), (held, unread, after)
    assert to_client == [{"type": "websocket.accept"}]  # the bounds stay between gate and replica


def test_a_message_past_the_bound_is_refused_in_the_gate_and_never_passed_on():
    async def go():
        sides, task = await accepted(4096)
        await sides.client.put(binary(MAX + 1))
        await settle()
        await sides.replica_send({"type": "websocket.send", "bytes": b"late"})  # after the close: dropped
        sides.done.set()
        await task
        return sides.pulled, sides.to_client

    pulled, to_client = run(go())
    assert [m["type"] for m in pulled] == ["websocket.connect", "websocket.disconnect"]
    assert pulled[-1]["code"] == 1009
    error = json.loads(to_client[1]["text"])
    assert error["code"] == "too_large" and str(MAX) in error["message"], to_client
    assert to_client[2] == {"type": "websocket.close", "code": 1009} and len(to_client) == 3


def test_output_taken_by_uvicorn_is_acknowledged_to_the_replica():
    """What uvicorn took for the client is told to the replica, gathered until a quarter of the
    replica's window (256 of 1024 bytes) waits to be told."""
    async def go():
        sides, task = await accepted(1024)
        told = []
        for _ in range(5):
            await sides.replica_send({"type": "websocket.send", "bytes": b"y" * 200})
            await settle()
            told.append(sum(m["bytes"] for m in sides.pulled if m["type"] == gate.SENT))
        sides.done.set()
        await task
        return told

    # 200 waits; 400 is told; 200 waits; 400 is told.
    assert run(go()) == [0, 400, 400, 800, 800]


def test_every_request_says_it_passed_the_gate_and_a_client_cannot_say_so_for_it():
    async def go():
        sides = Sides(path="/health", headers=[(gate.HEADER, b"forged"), (b"host", b"h")])
        sides.done.set()
        await sides.start()
        return sides.scope["headers"]

    headers = run(go())
    assert headers == [(b"host", b"h"), (gate.HEADER, b"1")]


def test_the_gate_sets_the_client_sockets_send_buffer_as_the_local_server_does():
    """uvicorn hands the middleware no transport: the gate finds the client's socket among the
    process's descriptors by its two addresses and sets --send-buffer on it (SO_SNDBUF), as the
    local server sets it on its own sockets."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        accepted, peer = server.accept()
        with accepted, socket.socket() as fresh:
            before = accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            fresh.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            found = gate.send_buffer(peer, accepted.getsockname(), 4096)
            after = accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            unknown = gate.send_buffer(("127.0.0.1", 1), accepted.getsockname(), 4096)
            want = fresh.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        other = client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert found and after == want != before and not unknown, (before, after, want)
    assert other == before  # the other end of the connection is not the one set
