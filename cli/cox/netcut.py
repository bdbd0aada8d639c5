"""Cut one local server process off the network, both ways, and heal it: a partition drill on
one machine (loopback), for the tests.

A server to be cut is started inside its own cgroup v2 directory (``server.cgroup``, set before
``start``: a socket belongs to the cgroup its process was in when the socket was made). The cut
is an iptables chain of its own, jumped to from ``OUTPUT -o lo`` and ``INPUT -i lo``, that drops

* every packet a socket of that cgroup sends or (early-demuxed) receives: its listening ports
  *and* the connections it opened itself (a Redis node's outgoing cluster-bus links, a NATS
  node's outgoing routes), established ones included;
* every TCP packet to or from the server's own ports (client, cluster bus or route, monitoring).

The process keeps running and its TCP connections stay open (nothing is reset): it simply
hears and says nothing until the chain is removed, as with a pulled cable. ``cut()`` always
removes its chain (a ``finally``); ``leftover_chains()`` lists any this module's prefix left.
Needs root, iptables with the ``cgroup`` match, and a writable cgroup v2 hierarchy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from itertools import count
from pathlib import Path

PREFIX = "COXCUT"
_seq = count()


def cgroup2_root() -> Path | None:
    """Where a cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` or, on a hybrid host,
    ``/sys/fs/cgroup/unified``), or None."""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    return None


def available() -> str | None:
    """None when a cut can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if not shutil.which("iptables"):
        return "no iptables"
    root = cgroup2_root()
    if root is None or not os.access(root, os.W_OK):
        return "no writable cgroup v2 hierarchy"
    return None


def make_cgroup(name: str) -> Path:
    """A fresh cgroup directory for one server (``name`` unique per process)."""
    root = cgroup2_root()
    assert root is not None
    path = root / f"cox-{os.getpid()}-{name}"
    path.mkdir(exist_ok=True)
    return path


def remove_cgroup(path: Path) -> None:
    """Remove a cgroup once its processes are gone (moved back to the root if any remain)."""
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            (path.parent / "cgroup.procs").write_text(pid)
        path.rmdir()


def _ipt(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {r.stderr.strip()}")
    return r


@contextlib.contextmanager
def cut(cgroup: Path, ports: list[int]) -> Iterator[str]:
    """Drop every packet of the processes in ``cgroup`` and every TCP packet to or from ``ports``
    on loopback while inside; the chain's name is yielded. Healed on exit, whatever happens."""
    root = cgroup2_root()
    assert root is not None
    rel = cgroup.relative_to(root).as_posix()
    chain = f"{PREFIX}{os.getpid()}x{next(_seq)}"[:28]
    _ipt("-N", chain)
    try:
        _ipt("-A", chain, "-m", "cgroup", "--path", rel, "-j", "DROP")
        for p in ports:
            _ipt("-A", chain, "-p", "tcp", "--dport", str(p), "-j", "DROP")
            _ipt("-A", chain, "-p", "tcp", "--sport", str(p), "-j", "DROP")
        _ipt("-I", "OUTPUT", "-o", "lo", "-j", chain)
        _ipt("-I", "INPUT", "-i", "lo", "-j", chain)
        yield chain
    finally:
        _ipt("-D", "OUTPUT", "-o", "lo", "-j", chain, check=False)
        _ipt("-D", "INPUT", "-i", "lo", "-j", chain, check=False)
        _ipt("-F", chain, check=False)
        _ipt("-X", chain, check=False)


def dropped(chain: str) -> int:
    """Packets the chain has dropped so far (proof the cut cut something)."""
    out = _ipt("-L", chain, "-v", "-n", "-x").stdout
    return sum(int(line.split()[0]) for line in out.splitlines()[2:] if line.split())


def leftover_chains() -> list[str]:
    """Chains of this module still present (of this process)."""
    out = _ipt("-S").stdout
    mine = f"{PREFIX}{os.getpid()}x"
    return sorted({w for line in out.splitlines() for w in line.split() if w.startswith(mine)})
