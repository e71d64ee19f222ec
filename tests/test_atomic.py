"""Atomic writes (atomic.py): a file written through `atomic_path` gets the mode a plain open()
would give it, without the process umask ever being set (it is process-wide: setting it, even to
read it, races with every other thread creating a file)."""

from __future__ import annotations

import os
import stat

import pytest

from codecport.atomic import atomic_path


@pytest.fixture
def umask_027():
    """The process umask 027 while the test runs (not the usual 022), the one before put back."""
    was = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(was)


@pytest.fixture
def umask_calls(monkeypatch):
    """Every call of os.umask from here on (each still made): a list of its arguments."""
    calls, real = [], os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real(mask))
    return calls


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.skipif(os.name != "posix", reason="file modes and the umask are POSIX's")
def test_an_atomic_file_has_the_mode_of_a_plain_one_and_the_umask_is_never_set(tmp_path, umask_027,
                                                                                umask_calls):
    with open(tmp_path / "plain.bin", "wb") as f:
        f.write(b"x")
    with atomic_path(tmp_path / "atomic.bin") as tmp, open(tmp, "wb") as f:
        assert mode(tmp) == 0o640  # already while it is written, as open()'s file would be
        f.write(b"x")
    assert mode(tmp_path / "atomic.bin") == mode(tmp_path / "plain.bin") == 0o666 & ~umask_027
    assert umask_calls == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atomic.bin", "plain.bin"]  # no .part left


def test_a_failed_block_leaves_nothing_and_keeps_the_old_file(tmp_path):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("midway")
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_a_temporary_name_taken_is_passed_over(tmp_path, monkeypatch):
    """The temporary file is made with O_EXCL: a name already there (another writer's) is never
    opened, another is drawn."""
    import secrets

    taken = tmp_path / ".out.bin.00000000.part"
    taken.write_bytes(b"someone else's")
    draws = iter(["00000000", "00000001"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws))
    with atomic_path(tmp_path / "out.bin") as tmp:
        assert tmp.name == ".out.bin.00000001.part"
        tmp.write_bytes(b"mine")
    assert taken.read_bytes() == b"someone else's" and (tmp_path / "out.bin").read_bytes() == b"mine"

