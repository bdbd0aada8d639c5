"""Ports for the servers a stack starts are chosen outside the kernel's ephemeral range.

``free_port`` used to bind port 0, read the port and close it; the server bound it later. In
between, the kernel could give that very port to an outgoing connection (it draws them from the
same ephemeral range), and the gateway then died with "address already in use" (CI, the serial
lane: a module's stack failed to start and four tests errored).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cox import servers
from cox.redis_cluster import _free_pair


def test_no_port_handed_out_is_one_the_kernel_gives_to_connections() -> None:
    lo, hi = servers.ephemeral_range()
    got = [servers.free_port() for _ in range(300)]
    assert not [p for p in got if lo <= p <= hi], (lo, hi)
    assert len(set(got)) == len(got), "this process never hands out one port twice"


def test_a_port_handed_out_is_free_to_bind() -> None:
    for _ in range(50):
        p = servers.free_port()
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_not_handed_out() -> None:
    held = []
    try:
        for _ in range(20):
            p = servers.free_port()
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            s.listen()
            held.append(s)
        ports = {s.getsockname()[1] for s in held}
        assert not ports & {servers.free_port() for _ in range(300)}
    finally:
        for s in held:
            s.close()


def test_a_cluster_node_s_port_and_bus_port_are_outside_the_ephemeral_range() -> None:
    lo, hi = servers.ephemeral_range()
    for _ in range(50):
        port, bus = _free_pair()
        assert not lo <= port <= hi and not lo <= bus <= hi


def test_a_port_another_process_handed_out_is_not_handed_out_again() -> None:
    """Parallel test workers and each ``cox up`` choose ports in processes of their own; a port one
    of them handed out is kept from the others until its server has bound it (CI once saw a
    gateway fail with "address already in use" on a port another worker's server had taken)."""
    import subprocess
    import sys

    code = "from cox import servers; print(' '.join(str(servers.free_port()) for _ in range(400)))"
    theirs = {int(p) for p in subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                             text=True, timeout=60).stdout.split()}
    assert len(theirs) == 400
    ours = {servers.free_port() for _ in range(400)}
    assert not ours & theirs


def _fill_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mtime_from_now: float) -> None:
    """Every port outside the kernel's range claimed, each file dated ``mtime_from_now`` seconds
    from now; the claims folder is a fresh one under ``tmp_path``."""
    import os
    import tempfile
    import time

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    lo, hi = servers.ephemeral_range()
    folder = servers.claims_folder()
    folder.mkdir(parents=True)
    when = time.time() + mtime_from_now
    for port in [*range(10_000, lo), *range(hi + 1, 65_536)]:
        path = folder / str(port)
        path.touch()
        os.utime(path, (when, when))


def test_claims_dated_ahead_of_the_clock_hold_no_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The project's CI once failed here: its temporary folder held a claim for nearly every port,
    dated ahead of the machine's clock (a clock set back, or a folder carried over from another
    machine), so every claim looked fresh for ever and every port fell back to the kernel's
    ephemeral range. A claim dated ahead of the clock is an old one."""
    _fill_claims(tmp_path, monkeypatch, 3_600)
    lo, hi = servers.ephemeral_range()
    got = [servers.free_port() for _ in range(200)]
    assert not [p for p in got if lo <= p <= hi]
    assert len(set(got)) == len(got)


def test_a_port_is_handed_out_outside_the_range_even_when_every_port_is_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims are a courtesy between processes; a folder that claims everything (a runaway caller,
    a claim that cannot be taken over) must not put a server on a port an outgoing connection
    may take meanwhile."""
    _fill_claims(tmp_path, monkeypatch, 0)
    lo, hi = servers.ephemeral_range()
    got = [servers.free_port() for _ in range(200)]
    assert not [p for p in got if lo <= p <= hi]
    assert len(set(got)) == len(got)
    for p in got[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
