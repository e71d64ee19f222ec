"""What a server under test costs in processes: CPU seconds and resident memory, by role.

A local `codec-serve` is one process. `codec-serve --engine ray` started without `--address` is a
driver, the private Ray it starts (raylet, GCS, agents: the node), Serve's controller and proxy,
and the replicas; they all stay in the session the bench started the driver in (Ray's daemons and
workers keep their starter's session), so a role's processes are found by their command line
among that session's: `ray::ProxyActor`, `ray::ServeReplica...`, the driver itself, the rest the
node. Linux /proc only (the bench's serve runs are on Linux).
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def roles(pid: int, engine: str) -> dict[str, list[int]]:
    """role -> the live processes of the server whose process (or driver) is `pid`."""
    if engine != "ray":
        return {"server": [pid]}
    out: dict[str, list[int]] = {"proxy": [], "replica": [], "driver": [], "node": []}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        other = int(stat.parent.name)
        fields = _stat(other)
        if fields is None or fields[0] == "Z" or int(fields[3]) != pid:  # not of the driver's session
            continue
        try:
            cmd = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        role = ("driver" if other == pid else "proxy" if cmd.startswith(b"ray::ProxyActor")
                else "replica" if cmd.startswith(b"ray::ServeReplica") else "node")
        out[role].append(other)
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of `pids` so far (a process gone counts nothing)."""
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def rss_mb(pids: list[int]) -> float:
    """Resident memory of `pids` together, in MiB (NaN if none could be read)."""
    total, read = 0.0, False
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total, read = total + int(line.split()[1]) / 1024, True
        except OSError:
            continue
    return total if read else float("nan")
