"""Ray, as the applications that run on it share it (`codec-run tokenize --engine ray`, `codec-serve
--engine ray`): its import with the environment set first, an address checked before Ray retries
it for minutes, and its C++ core worker's notes kept off the user's terminal."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import CodecportError

log = logging.getLogger(__name__)

# Set before ray is imported: no usage report, and (unless -v) none of Ray's start-up notes:
# the token-auth notice, Ray Data's, and the C++ core worker's note on constructor arguments.
QUIET_ENV = {"RAY_DATA_LOG_LEVEL": "ERROR"}


def import_ray(log: logging.Logger, needs: str, extra: str):
    """`ray`, imported after the environment above (unless `log` shows INFO); `needs` and `extra`
    make the error when it is not installed."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not log.isEnabledFor(logging.INFO):
        for k, v in QUIET_ENV.items():
            os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError as e:
        raise CodecportError(f"{needs} ({e}); pip install 'codecport[{extra}]'") from e
    return ray


# The opening of an HTTP/2 connection (RFC 9113 section 3.4: the preface, then an empty SETTINGS
# frame): Ray's GCS and its client server speak gRPC, which answers with a SETTINGS frame of its own.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 4


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """A `host:port` (or `ray://host:port`) that no one answers on, or that answers as something
    other than Ray (a dashboard's port given by mistake), is refused within `timeout` s: ray.init
    retries it for minutes, or hangs, printing its C++ logs meanwhile."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto" and the like: Ray's to resolve
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except (OSError, OverflowError) as e:
        raise CodecportError(f"cannot reach the Ray cluster at {address} "
                             f"({getattr(e, 'strerror', None) or e}); "
                             "is its head node running? check --address / RAY_ADDRESS") from None
    head = b""
    with conn, contextlib.suppress(OSError):  # a timeout, a reset: what came so far is the answer
        conn.sendall(_H2_PREFACE)
        while len(head) < 9 and (chunk := conn.recv(9 - len(head))):
            head += chunk
    if len(head) < 9 or head[3] != _SETTINGS:
        said = (f"it answered {head[:12]!r}" if head else f"it said nothing in {timeout:g} s")
        raise CodecportError(f"{address} answers, but not as a Ray cluster ({said}); give the head node's "
                             "GCS address (ray start --head prints it; port 6379 by default), not its "
                             "dashboard's (8265) or another service's: check --address / RAY_ADDRESS")


def head_node() -> str | None:
    """The id of the cluster's head node (Ray's own resource marks it), or None if none is alive.
    A blocking call to Ray's GCS."""
    import ray

    return next((n["NodeID"] for n in ray.nodes() if n.get("Alive")
                 and "node:__internal_head__" in n.get("Resources", {})), None)


# A line of Ray's C++ log, e.g. "[2026-12-01 16:51:25,203 E 1107 1107] core_worker.cc:2465: ...".
_CORE_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] ")


@contextmanager
def without_core_notes(active: bool) -> Iterator[None]:
    """The process's stderr (fd 2) less the lines of Ray's C++ core worker, which writes to it
    directly (every actor start notes that its constructor arguments are in the object store,
    ray#53727, which Ray Data's actor pools always are): they go to the log instead."""
    if not active:
        yield
        return
    saved, (read, write) = os.dup(2), os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def forward() -> None:
        pending = b""
        while chunk := os.read(read, 1 << 16):
            pending += chunk
            *lines, pending = re.split(rb"(?<=[\r\n])", pending)
            if pending and not pending.startswith(b"["):  # a progress bar's redraw: now
                lines, pending = [*lines, pending], b""
            for line in lines:
                if _CORE_LINE.match(line):
                    log.debug("ray: %s", line.decode(errors="replace").rstrip())
                else:
                    os.write(saved, line)
        if pending:
            os.write(saved, pending)

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread sees the end and stops
        thread.join(timeout=5)
        os.close(saved)
        os.close(read)
