"""`codec-serve`'s start, in process (the server and the Ray driver stubbed: nothing listens): a
folder with a damaged graph is refused at start on either engine, the Ray driver checks the folder
without opening a session, and the replica options that exclude each other are refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from codecport.cli.serve import serve_cli


@pytest.fixture
def started(monkeypatch) -> list:
    """What reached the local server or the Ray driver (each call's engine and arguments), and
    every session opened meanwhile."""
    from codecport.runtime import folder, graph
    from codecport.serve import onray, server

    calls = []

    def local(codec, config, announce):
        calls.append(("local", codec, config))
        announce("http://127.0.0.1:1")

    def on_ray(folder, provider, fallback, options, config, plan, announce, tell=None):
        calls.append(("ray", folder, provider, fallback, options, config, plan))
        announce("http://127.0.0.1:1")

    def session(*args, **kwargs):
        calls.append(("session", *args))
        return opened(*args, **kwargs)

    opened = graph.open_graph
    monkeypatch.setattr(server, "run", local)
    monkeypatch.setattr(onray, "run_on_ray", on_ray)
    monkeypatch.setattr(folder, "open_graph", session)
    monkeypatch.setattr(graph, "open_graph", session)
    return calls


def serve(*args) -> tuple[int, list[str]]:
    result = CliRunner().invoke(serve_cli, ["--port", "0", *map(str, args)])
    return result.exit_code, result.output.strip().splitlines()


@pytest.mark.parametrize("engine", ["local", "ray"])
@pytest.mark.parametrize("graph", ["decoder_step", "encoder_slots_s1"])
def test_a_truncated_graph_the_server_runs_is_refused_at_start(tiny_mimi_export, tmp_path, started, engine,
                                                              graph):
    """The step graph (which a stream opens only as it starts: the pool steps the slot graphs) or a
    slot graph cut in half: one error line naming it, exit 1, and no server started (it said
    "listening", then refused every stream with `internal`)."""
    bad = shutil.copytree(tiny_mimi_export, tmp_path / "model")
    data = (bad / f"{graph}.onnx").read_bytes()
    (bad / f"{graph}.onnx").write_bytes(data[: len(data) // 2])
    code, lines = serve("-m", bad, "--engine", engine)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {bad / graph}.onnx: not a loadable model") and "truncated" in lines[0]
    assert lines[0].endswith("re-run codec-export") and not [c for c in started if c[0] != "session"]


def test_the_ray_driver_checks_the_folder_without_a_session(tiny_mimi_export, started):
    """--engine ray: the replicas open their sessions, the driver none (with CUDA it would hold a
    context for nothing); the announce line still says the codec, preset, provider and streams."""
    code, lines = serve("-m", tiny_mimi_export, "--engine", "ray", "--slots", "2")
    assert code == 0, lines
    assert [c[0] for c in started] == ["ray"]
    _, folder, provider, fallback, options, config, plan = started[0]
    assert (folder, provider, fallback, options) == (str(Path(tiny_mimi_export).resolve()), "cpu", None, {})
    assert config.slots == 2 and (plan.replicas, plan.autoscale) == (1, None)
    assert lines[0] == (f"serving Mimi tiny ({tiny_mimi_export}) on CPUExecutionProvider: 2 slots a side a "
                        "replica (encoder, decoder), on Ray: 1 replica"), lines


def test_the_ray_driver_refuses_a_bad_replica_option(tiny_mimi_export, started):
    """An option of codecport's the replicas would refuse, refused by the driver before Ray starts."""
    code, lines = serve("-m", tiny_mimi_export, "--engine", "ray", "--provider-option", "threads=many")
    assert code == 1 and lines == ["error: option threads must be auto or a whole number from 1 to 1024, got "
                                   "'many'"], lines
    assert not started


def test_the_local_server_gets_an_opened_codec(tiny_mimi_export, started):
    code, lines = serve("-m", tiny_mimi_export)
    assert code == 0 and [c[0] for c in started if c[0] != "session"] == ["local"], lines
    assert started[-1][1].sessions and any(c[0] == "session" for c in started)
    assert lines[0].startswith(f"serving Mimi tiny ({tiny_mimi_export}) on CPUExecutionProvider: 8 slots")


@pytest.mark.parametrize("replicas", ["2", "1"])
def test_replicas_and_autoscale_exclude_each_other(tiny_mimi_export, started, replicas):
    """--autoscale silently won over --replicas, even one the user wrote out."""
    code, lines = serve("-m", tiny_mimi_export, "--engine", "ray", "--replicas", replicas,
                        "--autoscale", "1:4")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: --replicas and --autoscale exclude each other: choose") and not started
    code, lines = serve("-m", tiny_mimi_export, "--engine", "ray", "--autoscale", "1:4")
    assert code == 0 and started[-1][-1].autoscale == (1, 4), lines
