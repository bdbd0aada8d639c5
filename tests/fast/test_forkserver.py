"""cox up's fork server (cox/forkserver.py): a fork behaves as the ``python -m`` child it replaces."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cox.forkserver import ForkServer

MODULE = "tests.support.forkee"


@pytest.fixture
def server() -> Iterator[ForkServer]:
    s = ForkServer(preload=("json",))
    s.start()
    try:
        yield s
    finally:
        s.close()


def test_a_fork_runs_the_module_with_its_environment_folder_and_log_and_exits_with_its_code(
        server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    p = server.spawn(MODULE, {"FORKEE_SAY": "hello", "FORKEE_CODE": "3"}, log, cwd=str(tmp_path))
    assert p.wait(30) == 3
    assert log.read_text() == f"said hello in {tmp_path}\n"
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_a_fork_shows_as_its_module_and_its_environment_is_not_in_proc(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.touch()
    p = server.spawn(MODULE, {"FORKEE_WAIT": "1", "FORKEE_SAY": "secret-value"}, log, name="svc-1")
    try:
        deadline = time.monotonic() + 20
        while "said" not in log.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc = psutil.Process(p.pid)
        assert " ".join(a for a in proc.cmdline() if a).endswith(f"-m {MODULE} [svc-1]")
        assert "secret-value" not in "".join(proc.environ().values())
        assert p.poll() is None
    finally:
        p.kill()
    assert p.wait(10) == -signal.SIGKILL


def test_signals_reach_the_fork_and_its_status_reads_as_popen_s(server: ForkServer, tmp_path: Path) -> None:
    p = server.spawn(MODULE, {"FORKEE_WAIT": "1"}, tmp_path / "log")
    p.terminate()
    assert p.wait(10) == -signal.SIGTERM
    p.send_signal(signal.SIGKILL)  # after its end: nothing, as Popen
    assert p.poll() == -signal.SIGTERM


def test_a_fork_server_that_dies_takes_its_forks_along_and_a_new_one_starts(
        server: ForkServer, tmp_path: Path) -> None:
    p = server.spawn(MODULE, {"FORKEE_WAIT": "1"}, tmp_path / "log")
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    assert p.wait(10) == -signal.SIGTERM  # the kernel's SIGTERM (PR_SET_PDEATHSIG)
    assert not psutil.pid_exists(p.pid) or psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE
    again = server.spawn(MODULE, {"FORKEE_CODE": "0"}, tmp_path / "log2")
    assert again.wait(30) == 0


def test_a_module_that_cannot_be_found_ends_with_1_and_says_why(server: ForkServer, tmp_path: Path) -> None:
    p = server.spawn("no_such_module_here", {}, tmp_path / "log")
    assert p.wait(30) == 1
    assert "No module named no_such_module_here" in (tmp_path / "log").read_text()
