"""Who may talk to a server on this machine: the Host a request names, and the Origin of the
page behind a browser's WebSocket. Shared by `codec-run web` (web.py) and `codec-serve`.

A page of any site open in a browser here can reach 127.0.0.1: through a name it controls that
it points at this machine (DNS rebinding: its requests carry that name as their Host), and, for
a WebSocket, directly (a WebSocket has no same-origin rule; the browser only says which page
opened it, in `Origin`). So a request must name this server (`hosts`), and a browser's
WebSocket must come from a page the server was told to serve (`origin_allowed`).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
DEFAULT_PORTS = {"http": 80, "https": 443}


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def hosts(listen: str, port: int) -> frozenset[str]:
    """The Host headers a server listening on `listen`:`port` answers to: that address and the
    loopback names, with the port (and without it on port 80, as a browser sends it there)."""
    names = {_bracketed(listen.lower()), *LOOPBACK}
    return frozenset({f"{h}:{port}" for h in names} | (names if port == 80 else set()))


def host_allowed(header: str | None, allowed: frozenset[str], listen: str = "") -> bool:
    """Whether a request's `Host` header names this server. On a wildcard address (`0.0.0.0`,
    `::`), any IP address with the server's port does too: an address literal is no rebinding
    (the page that uses it is of that address, and its Origin says so), a name may be."""
    host = (header or "").strip().lower()
    if host in allowed:
        return True
    if listen not in ("0.0.0.0", "::"):
        return False
    parts = urlsplit(f"//{host}")
    try:
        port, name = parts.port, parts.hostname or ""
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    ports = {int(h.rsplit(":", 1)[1]) for h in allowed if h.rsplit(":", 1)[-1].isdigit()}
    return (port in ports or (port is None and 80 in ports)) and (listen == "::" or address.version == 4)


def normal_origin(value: str) -> str:
    """`value` as a browser writes an Origin (`http://localhost:5173`: scheme and host in lower
    case, no default port, no path); ValueError saying what is wrong."""
    parts = urlsplit(value.strip())
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{value!r} is not an origin; give a page's scheme, host and port, as "
                         "http://localhost:5173")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r} has a bad port; give an origin as http://localhost:5173") from None
    host = _bracketed(parts.hostname)
    return f"{parts.scheme}://{host}" + ("" if port in (None, DEFAULT_PORTS[parts.scheme]) else f":{port}")


def origin_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a WebSocket from a page of `header` (its `Origin`) may connect: none (a client that
    is not a browser sends none), or one of `allowed` (normalized by `normal_origin`)."""
    if header is None:
        return True
    try:
        return normal_origin(header) in allowed
    except ValueError:
        return False
