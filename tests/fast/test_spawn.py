"""The runner's command spawn (``tools.spawn``): the standard library's vfork-based spawn watched
from the event loop, on uvloop (the services' loop) and on asyncio's own."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from cox_runner.workspace.tools import spawn

LOOPS = {"uvloop": uvloop.run, "asyncio": asyncio.run}


def run(loop: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return LOOPS[loop](main())


def fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("loop", LOOPS)
def test_output_and_exit_status_arrive_and_nothing_is_left_open(loop: str, tmp_path: Path) -> None:
    async def once() -> tuple[bytes, int]:
        child = await spawn(["/bin/sh", "-c", "echo out; echo err >&2; pwd; exit 7"], cwd=str(tmp_path),
                            env={"PATH": "/usr/bin:/bin"})
        out = await child.stdout.read()
        code = await child.wait()
        child.close()
        await asyncio.sleep(0.01)  # the transport closes on a later loop turn
        return out, code

    async def main() -> tuple[bytes, int]:
        first = await once()  # the loop's own descriptors, made on first use (uvloop: /dev/null)
        before = fds()
        for _ in range(20):
            assert await once() == first
        assert fds() <= before, "a pipe or pidfd left open"
        return first

    out, code = run(loop, main)
    assert out == f"out\nerr\n{tmp_path}\n".encode()
    assert code == 7


@pytest.mark.parametrize("loop", LOOPS)
def test_a_killed_command_is_reaped_with_its_signal(loop: str, tmp_path: Path) -> None:
    async def main() -> tuple[int | None, int, float]:
        child = await spawn(["/bin/sleep", "30"], cwd=str(tmp_path), env={})
        assert child.returncode is None
        t0 = time.monotonic()
        os.killpg(child.pid, signal.SIGKILL)  # its own session: its own process group
        code = await asyncio.wait_for(child.wait(), 10)
        child.close()
        return child.returncode, code, time.monotonic() - t0

    returncode, code, took = run(loop, main)
    assert returncode == code == -signal.SIGKILL
    assert took < 10


@pytest.mark.parametrize("loop", LOOPS)
def test_many_commands_at_once_each_get_their_own_output(loop: str, tmp_path: Path) -> None:
    async def one(i: int) -> tuple[bytes, int]:
        child = await spawn(["/bin/sh", "-c", f"echo {i}; exit {i % 5}"], cwd=str(tmp_path), env={})
        try:
            return await child.stdout.read(), await child.wait()
        finally:
            child.close()

    async def main() -> list[tuple[bytes, int]]:
        return list(await asyncio.gather(*(one(i) for i in range(40))))

    assert run(loop, main) == [(f"{i}\n".encode(), i % 5) for i in range(40)]


def test_a_program_that_cannot_start_is_an_error_and_leaks_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(FileNotFoundError):
            await spawn(["/no/such/program"], cwd=str(tmp_path), env={})
        before = fds()
        with pytest.raises(FileNotFoundError):
            await spawn(["/no/such/program"], cwd=str(tmp_path), env={})
        assert fds() <= before

    uvloop.run(main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_hooks_stdin_payload_reaches_it_and_its_stderr_comes_apart(loop: str, tmp_path: Path) -> None:
    """A hook's spawn: its payload on stdin (larger than a pipe's buffer, so the write waits on
    the reader), its stdout and stderr on pipes of their own; nothing left open."""
    payload = b"x" * 200_000 + b"\n"

    async def once() -> tuple[bytes, bytes, int]:
        child = await spawn(["/bin/sh", "-c", "wc -c; echo oops >&2; exit 3"], cwd=str(tmp_path),
                            env={"PATH": "/usr/bin:/bin"}, stdin=True, stderr_apart=True)
        assert child.stdin is not None and child.stderr is not None

        async def feed() -> None:
            assert child.stdin is not None
            child.stdin.write(payload)
            await child.stdin.drain()
            child.stdin.close()

        _, out, err, code = await asyncio.gather(feed(), child.stdout.read(), child.stderr.read(), child.wait())
        child.close()
        await asyncio.sleep(0.01)
        return out, err, code

    async def main() -> tuple[bytes, bytes, int]:
        first = await once()
        before = fds()
        for _ in range(10):
            assert await once() == first
        assert fds() <= before, "a pipe or pidfd left open"
        return first

    out, err, code = run(loop, main)
    assert (out.strip(), err, code) == (str(len(payload)).encode(), b"oops\n", 3)


@pytest.mark.parametrize("loop", LOOPS)
def test_descriptors_opened_by_other_threads_meanwhile_are_never_closed_under_them(loop: str, tmp_path: Path) -> None:
    """uvloop closes a read pipe's descriptor twice (libuv closes it, then the file object it was
    given): another thread that opened a file in between had its descriptor closed under it, and
    a command's pipe or pidfd could be closed the same way (a CI drill's ``sleep 0.2`` was watched
    until its 120 s time-out). A thread opening and closing files beside 600 commands: every
    command ends with its output, and no close in the thread fails."""
    import threading

    stop = threading.Event()
    failures: list[OSError] = []

    def churn() -> None:
        while not stop.is_set():
            fd = os.open("/dev/null", os.O_RDONLY)
            try:
                os.fstat(fd)
                os.close(fd)
            except OSError as exc:  # EBADF: closed under this thread by someone else
                failures.append(exc)

    async def one(i: int) -> bytes:
        child = await spawn(["/bin/echo", str(i)], cwd=str(tmp_path), env={})
        try:
            out, _ = await asyncio.wait_for(asyncio.gather(child.stdout.read(), child.wait()), 20)
            return out
        finally:
            child.close()

    async def main() -> list[bytes]:
        sem = asyncio.Semaphore(20)

        async def limited(i: int) -> bytes:
            async with sem:
                return await one(i)

        return list(await asyncio.gather(*(limited(i) for i in range(600))))

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        outs = run(loop, main)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert outs == [f"{i}\n".encode() for i in range(600)]
    assert not failures, f"{len(failures)} descriptors closed under the thread: {failures[0]!r}"
