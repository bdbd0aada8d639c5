"""The descriptor walk a fork copies a workspace with (coxswain.fdcopy), without a server.

Attack first: a process keeps swapping a folder and a file of the source for links to a "state"
folder outside it (with a credentials.json) while the tree is copied again and again; nothing
from outside may be in any copy, and links stay links. Then the windows one at a time, made
deterministic: a file or a folder replaced by a link (or a FIFO) between the look and the open.
Then what a copy keeps (modes less setuid/setgid, times, links), what it leaves out (the store
folder, FIFOs, sockets, itself), its bounds, and that its errors name no host path.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from coxswain import fdcopy, safefs
from coxswain.errors import CoxError, Invalid, TooLarge, describe, without_paths

SECRET = b"NATS-ADMIN-PASSWORD-do-not-copy"
SWAPPER = r"""
import ctypes, ctypes.util, os, sys, time
ws, state, stop, raced, max_swaps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
os.chdir(ws)
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
RENAME_EXCHANGE = 2
def exchange(a, b):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
os.symlink(state, "d.link")                                   # d <-> a link to the state folder
os.symlink(os.path.join(state, "credentials.json"), "f.link")  # f <-> a link to the credentials
os.symlink(state, "deep/a.link")
n = 0
deadline = time.monotonic() + 120
while n < max_swaps and not os.path.exists(stop) and time.monotonic() < deadline:
    exchange("d", "d.link"); exchange("f", "f.link"); exchange("deep/a", "deep/a.link")
    n += 1
    if n == 200:
        open(raced, "w").close()  # the copier goes on until both sides have done 200
    # and the slow way: the folder renamed away and a link renamed onto its name
    os.rename("d", "d.real"); os.symlink(state, "d.tmp"); os.rename("d.tmp", "d")
    os.unlink("d"); os.rename("d.real", "d")
    os.symlink(os.path.join(state, "credentials.json"), "g.tmp"); os.rename("g.tmp", "g")
    with open("g.new", "wb") as fh:
        fh.write(b"plain g")
    os.rename("g.new", "g")
print(n)
"""


def make_state(tmp: Path) -> Path:
    state = tmp / "state"
    (state / "nats").mkdir(parents=True)
    (state / "credentials.json").write_bytes(b'{"admin": "' + SECRET + b'"}')
    (state / "nats" / "store.dat").write_bytes(SECRET * 10)
    (state / "redis.aof").write_bytes(SECRET)
    return state


def make_ws(tmp: Path) -> Path:
    ws = tmp / "ws"
    (ws / "d").mkdir(parents=True)
    for i in range(40):
        (ws / "d" / f"x{i}").write_bytes(b"inside %d" % i)
    (ws / "f").write_bytes(b"plain f")
    (ws / "g").write_bytes(b"plain g")
    (ws / "deep" / "a" / "b").mkdir(parents=True)
    (ws / "deep" / "a" / "b" / "inner.txt").write_bytes(b"inner")
    (ws / ".coxswain").mkdir()
    (ws / ".coxswain" / "index.jsonl").write_bytes(b"store")
    return ws


def fd(path: Path) -> int:
    return os.open(path, fdcopy.DIR_FLAGS)


def copy(src: Path, dst: Path, *, exclude: Iterable[str] = (), limits: fdcopy.Limits | None = None) -> fdcopy.Copied:
    dst.mkdir()
    s, d = fd(src), fd(dst)
    try:
        return fdcopy.copy_tree(s, d, exclude=exclude, limits=limits)
    finally:
        os.close(s)
        os.close(d)


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    for dirpath, dirnames, names in os.walk(root, followlinks=False):
        for n in dirnames + names:
            p = Path(dirpath) / n
            yield p, os.lstat(p)


def assert_nothing_from_outside(dst: Path, state: Path) -> None:
    for p, st in walk(dst):
        if stat.S_ISREG(st.st_mode):
            assert SECRET not in p.read_bytes(), f"{p.relative_to(dst)} holds the state folder's content"
            assert p.name not in ("credentials.json", "store.dat", "redis.aof"), p
        elif stat.S_ISDIR(st.st_mode):
            assert p.name != "nats", p
        else:
            assert stat.S_ISLNK(st.st_mode), p  # nothing but files, folders and links
    # what the swapped names are in the copy: the real thing, or a link (its text, not followed)
    for name in ("d", "f", "g", "deep/a"):
        p = dst / name
        if p.is_symlink():
            assert os.readlink(p).startswith(str(state)), p
        elif p.exists():
            assert not stat.S_ISLNK(os.lstat(p).st_mode)
    if (dst / "d").is_dir() and not (dst / "d").is_symlink():
        assert {q.name for q in (dst / "d").iterdir()} <= {f"x{i}" for i in range(40)}


# ------------------------------------------------------------------ the attack


def test_a_copy_raced_by_link_swaps_holds_nothing_from_outside(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    ws = make_ws(tmp_path)
    stop, raced = tmp_path / "stop", tmp_path / "raced"
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(ws), str(state), str(stop), str(raced), "100000"],
                               stdout=subprocess.PIPE, text=True)
    copies = 0
    deadline = time.monotonic() + 100
    try:
        time.sleep(0.05)
        # at least 200 copies, and on until the swapper has done 200 rounds beside them (a loaded
        # host can run either side slower than the other)
        while (copies < 200 or not raced.exists()) and time.monotonic() < deadline:
            dst = tmp_path / f"copy-{copies}"
            try:
                copy(ws, dst, exclude=[".coxswain"])
            except fdcopy.CopyFailed as exc:
                # a folder renamed away under the walk may stop it; never with a host path
                assert str(tmp_path) not in exc.detail, exc.detail
            assert_nothing_from_outside(dst, state)
            assert not (dst / ".coxswain").exists()
            copies += 1
    finally:
        stop.touch()
        out, _ = swapper.communicate(timeout=60)
    assert swapper.returncode == 0
    swaps = int(out.strip())
    assert copies >= 200 and swaps >= 200, (copies, swaps)


def test_every_entry_swapped_between_the_look_and_the_open_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window itself: each name is looked at (lstat: a file, a folder) and replaced by a
    link to the state folder before it is opened."""
    state = make_state(tmp_path)
    ws = make_ws(tmp_path)
    real_stat = os.stat
    swapped: list[str] = []

    def look_then_swap(path: object, *a: object, **kw: object) -> os.stat_result:
        st = real_stat(path, *a, **kw)  # type: ignore[arg-type]
        if kw.get("dir_fd") is not None and path in ("f", "d", "b") and path not in swapped:
            swapped.append(str(path))
            where = {"f": ws / "f", "d": ws / "d", "b": ws / "deep" / "a" / "b"}[str(path)]
            aside = where.with_name(where.name + ".aside")
            os.rename(where, aside)
            os.symlink(state / "credentials.json" if path == "f" else state, where)
        return st

    monkeypatch.setattr(os, "stat", look_then_swap)
    out = copy(ws, tmp_path / "dst", exclude=[".coxswain"])
    monkeypatch.undo()
    dst = tmp_path / "dst"
    assert sorted(swapped) == ["b", "d", "f"]
    assert_nothing_from_outside(dst, state)
    for rel, to in (("f", state / "credentials.json"), ("d", state), ("deep/a/b", state)):
        assert (dst / rel).is_symlink() and os.readlink(dst / rel) == str(to), rel
    assert out.links >= 3


def test_a_fifo_in_the_source_or_swapped_in_never_hangs_the_copy(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_ws(tmp_path)
    os.mkfifo(ws / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ws / "sock"))
    real_stat = os.stat

    def swap_in_fifo(path: object, *a: object, **kw: object) -> os.stat_result:
        st = real_stat(path, *a, **kw)  # type: ignore[arg-type]
        if path == "g" and kw.get("dir_fd") is not None and not (ws / "g.aside").exists():
            os.rename(ws / "g", ws / "g.aside")
            os.mkfifo(ws / "g")  # looked at as a file, opened as a FIFO nobody writes
        return st

    monkeypatch.setattr(os, "stat", swap_in_fifo)
    result: list[fdcopy.Copied] = []
    t = threading.Thread(target=lambda: result.append(copy(ws, tmp_path / "dst")), daemon=True)
    t.start()
    t.join(timeout=20)
    monkeypatch.undo()
    sock.close()
    assert not t.is_alive(), "the copy hangs on a FIFO"
    dst = tmp_path / "dst"
    assert not (dst / "pipe").exists() and not (dst / "sock").exists() and not (dst / "g").exists()
    assert sorted(result[0].left_out) == ["g", "pipe", "sock"]
    assert (dst / "f").read_bytes() == b"plain f"


# ------------------------------------------------------------------ what a copy is


def test_a_copy_keeps_modes_less_setuid_times_and_links(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "ro" / "sub").mkdir(parents=True)
    (ws / "ro" / "sub" / "x").write_bytes(b"x")
    (ws / "tool").write_bytes(b"#!/bin/sh\n")
    os.chmod(ws / "tool", 0o6755)
    (ws / "sgid").mkdir()
    os.chmod(ws / "sgid", 0o2775)
    os.symlink("tool", ws / "rel-link")
    os.symlink("/etc/passwd", ws / "abs-link")
    os.symlink("nowhere", ws / "dangling")
    os.utime(ws / "tool", ns=(1_000_000_000, 1_500_000_000_123))
    os.utime(ws / "abs-link", ns=(2_000_000_000, 2_500_000_000), follow_symlinks=False)
    os.utime(ws / "ro" / "sub", ns=(3_000_000_000, 3_500_000_000))
    os.chmod(ws / "ro", 0o555)
    try:
        out = copy(ws, tmp_path / "dst")
        dst = tmp_path / "dst"
        assert stat.S_IMODE(os.stat(dst / "tool").st_mode) == 0o755
        assert stat.S_IMODE(os.stat(dst / "sgid").st_mode) == 0o775
        assert stat.S_IMODE(os.stat(dst / "ro").st_mode) == 0o555
        assert (dst / "ro" / "sub" / "x").read_bytes() == b"x"
        assert os.stat(dst / "tool").st_mtime_ns == 1_500_000_000_123
        assert os.lstat(dst / "abs-link").st_mtime_ns == 2_500_000_000
        assert os.stat(dst / "ro" / "sub").st_mtime_ns == 3_500_000_000
        assert os.readlink(dst / "rel-link") == "tool" and os.readlink(dst / "abs-link") == "/etc/passwd"
        assert os.readlink(dst / "dangling") == "nowhere"
        assert (out.files, out.dirs, out.links) == (2, 3, 3)
        assert out.bytes == len(b"#!/bin/sh\n") + 1
    finally:
        os.chmod(ws / "ro", 0o755)
        if (tmp_path / "dst" / "ro").exists():
            os.chmod(tmp_path / "dst" / "ro", 0o755)


def test_a_copy_leaves_out_the_store_folder_and_itself(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    (ws / "deep" / ".coxswain").mkdir()  # only the named path is left out, not a nested namesake
    out = copy(ws, ws / "ws-fork-1", exclude=[".coxswain"])
    dst = ws / "ws-fork-1"
    assert not (dst / ".coxswain").exists() and (dst / "deep" / ".coxswain").is_dir()
    assert not (dst / "ws-fork-1").exists()
    assert (dst / "d" / "x39").read_bytes() == b"inside 39"
    assert out.files == 40 + 3


def test_a_big_or_deep_tree_is_refused_with_the_bound_and_no_host_path(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    with pytest.raises(TooLarge) as many:
        copy(ws, tmp_path / "d1", limits=fdcopy.Limits(max_entries=10))
    assert "10" in many.value.detail and str(tmp_path) not in many.value.detail
    with pytest.raises(TooLarge) as big:
        copy(ws, tmp_path / "d2", limits=fdcopy.Limits(max_bytes=100))
    assert "100 bytes" in big.value.detail and str(tmp_path) not in big.value.detail
    deep = ws / "n"
    for _ in range(12):
        deep = deep / "n"
    deep.mkdir(parents=True)
    with pytest.raises(TooLarge) as nested:
        copy(ws, tmp_path / "d3", limits=fdcopy.Limits(max_depth=8))
    assert "8 deep" in nested.value.detail and "'n/n/n" in nested.value.detail
    assert str(tmp_path) not in nested.value.detail
    # exactly at the bounds: copied
    small = tmp_path / "small"
    small.mkdir()
    (small / "a").write_bytes(b"12345")
    out = copy(small, tmp_path / "d4", limits=fdcopy.Limits(max_entries=1, max_bytes=5))
    assert (out.files, out.bytes) == (1, 5)


def test_a_failed_copy_names_the_entry_relative_to_the_folder(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "f").write_bytes(b"already here")  # the copy's O_EXCL create of f fails
    s, d = fd(ws), fd(dst)
    try:
        with pytest.raises(fdcopy.CopyFailed) as failed:
            fdcopy.copy_tree(s, d)
    finally:
        os.close(s)
        os.close(d)
    assert "'f'" in failed.value.detail and "File exists" in failed.value.detail
    assert str(tmp_path) not in failed.value.detail and failed.value.status == 500


def test_an_unexpected_error_is_described_without_host_paths() -> None:
    exc = FileNotFoundError(2, "No such file or directory", "/var/lib/cox/state/credentials.json")
    assert describe(exc) == "FileNotFoundError: No such file or directory"
    got = describe(RuntimeError("cannot copy '/srv/cox/workspaces/w1/a' to /srv/cox/workspaces/w1-fork-1/a: boom"))
    assert "/srv" not in got and "<path>" in got and "boom" in got
    assert without_paths("a/b and ./c/d stay; /abs/p goes") == "a/b and ./c/d stay; <path> goes"
    assert CoxError(without_paths("[Errno 2] '/tmp/x'")).detail == "[Errno 2] '<path>'"



def test_a_read_of_a_fifo_is_refused_at_once_not_hung(tmp_path: Path) -> None:
    """safefs.read (a write's keep, read_file, instructions, hooks.json) opened without
    O_NONBLOCK waited forever for a writer of a FIFO a command left in the workspace."""
    os.mkfifo(tmp_path / "AGENTS.md")
    got: list[BaseException] = []

    def read() -> None:
        try:
            safefs.read(tmp_path, "AGENTS.md")
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            got.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout=10)
    if t.is_alive():  # unblock the thread: open the FIFO for writing
        os.close(os.open(tmp_path / "AGENTS.md", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("safefs.read hangs on a FIFO")
    assert len(got) == 1 and isinstance(got[0], Invalid) and "not a regular file" in str(got[0])
    assert str(tmp_path) not in str(got[0])


def test_resolving_a_path_whose_link_is_swapped_for_a_folder_is_refused_not_an_oserror(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.path.realpath lstat()s a link, then readlink()s it: swapped for a folder in between it
    raised a bare OSError (EINVAL, with the host path), and a fork answered 500 with it."""
    (tmp_path / "d").mkdir()
    real_lstat = os.lstat

    def link_then_folder(path: object, *a: object, **kw: object) -> os.stat_result:
        if str(path) == str(tmp_path / "d"):
            os.symlink("/", tmp_path / "elsewhere")
            st = real_lstat(tmp_path / "elsewhere")  # what realpath sees: a link
            os.unlink(tmp_path / "elsewhere")
            return st
        return real_lstat(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", link_then_folder)
    with pytest.raises(CoxError) as refused:
        safefs.resolve(tmp_path, "d/x1")
    monkeypatch.undo()
    assert refused.value.code == "refused" and str(tmp_path) not in refused.value.detail
