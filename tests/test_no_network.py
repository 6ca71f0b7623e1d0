"""No network at run time: the README tour runs with every network socket refused; only
`ppsim workload fetch` tries to connect, and offline it fails with one line."""

from __future__ import annotations

import shlex
import socket

import pytest

from sim.cli import main

from conftest import REPO, SHARED_DATA
from test_readme_tour import QUICK, tour_commands


class NetworkUsed(OSError):
    pass


@pytest.fixture
def no_network(monkeypatch):
    """Refuse internet sockets, name lookups and connections; record every attempt.
    Local socket pairs (AF_UNIX, used by multiprocessing) stay allowed."""
    attempts: list[str] = []
    real_socket = socket.socket

    class GuardedSocket(real_socket):
        def __init__(self, family=socket.AF_INET, *args, **kwargs):
            if family in (socket.AF_INET, socket.AF_INET6):
                attempts.append(f"socket(family={family})")
                raise NetworkUsed("network disabled in this test")
            super().__init__(family, *args, **kwargs)

    def refuse(name):
        def f(*args, **kwargs):
            attempts.append(f"{name}{args[:2]}")
            raise NetworkUsed(f"network disabled in this test ({name})")
        return f

    monkeypatch.setattr(socket, "socket", GuardedSocket)
    for name in ("create_connection", "getaddrinfo", "gethostbyname"):
        monkeypatch.setattr(socket, name, refuse(name))
    return attempts


def test_the_guard_refuses_internet_sockets(no_network):
    with pytest.raises(NetworkUsed):
        socket.create_connection(("example.org", 443))
    a, b = socket.socketpair()  # local IPC still works
    a.close(), b.close()
    assert no_network


def test_fetch_offline_is_a_one_line_error(no_network, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path / "cache"))
    code = main(["workload", "fetch", "azure-conv-2023"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cannot download https://" in err
    assert no_network  # fetch is the command that goes to the network


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "azure-llm-inference-2023").is_dir(), reason="needs ../shared/data (the Azure trace)")
def test_the_readme_tour_runs_without_network(no_network, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PIPESIM_CACHE", str(SHARED_DATA / "azure-llm-inference-2023"))
    for cmd in tour_commands():
        argv = shlex.split(cmd)[1:]
        if argv[:2] == ["workload", "fetch"]:
            monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path / "cache"))
            src = SHARED_DATA / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
            argv += ["--url", src.as_uri()]  # a local file: no socket
        argv = [a.replace("runs/", f"{tmp_path}/runs/") for a in argv]
        argv += QUICK.get(argv[0], [])
        if argv[0] in ("reproduce", "plan") and "--out" not in argv:
            argv += ["--out", str(tmp_path / f"out-{argv[0]}")]
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 0, f"{cmd}: exit {code}: {err[-500:]}"
        assert no_network == [], f"{cmd} opened a connection: {no_network}"
    assert (tmp_path / "out-reproduce/fig1.png").is_file()
