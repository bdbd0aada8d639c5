"""Calls that change nothing are decided in the runner by guard's own function for them.

The runner no longer sends a read (``read_file``, ``list_dir``, ``find_files``, ``search_text``),
``respond``, a plan tool or a program read/stop to guard over NATS: it calls
:func:`coxswain.readpolicy.decide`, which guard's policy also calls first. These tests hold the
two to the same answers over the attacks a read is fenced against (leaving the workspace by
``..``, an absolute path, a link, a link loop; the credential denylist at any depth; a workspace
that is itself a link out of the root) and keep every other call going to guard.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cox_guard import policy
from coxswain import readpolicy
from coxswain.config import Settings
from coxswain.models import CallSpec, GuardRequest, GuardResult

READ_CASES = [
    "notes.txt", "", ".", "sub", "sub/deep.txt", "./sub/../notes.txt", "missing/file.txt",
    "../outside.txt", "../../etc/passwd", "/etc/passwd", "{outside}", "link/secret.txt", "link",
    "loop", "loop/x", "innerlink/deep.txt", ".ssh/config", "sub/.env", "sub/.aws/credentials",
    "certs/server.pem", "id_rsa", "deploy/id_rsa.pub", ".netrc", "envlink", "a\x00b", "x" * 5000,
]


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "root"
    ws = root / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "notes.txt").write_text("hello\n")
    (ws / "sub" / "deep.txt").write_text("deep\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours\n")
    (ws / "link").symlink_to(outside)
    (ws / "innerlink").symlink_to(ws / "sub")
    (ws / "loop").symlink_to(ws / "loop")
    (ws / ".env").write_text("A=1\n")
    (ws / "envlink").symlink_to(ws / ".env")
    escaped = root / "escaped"  # a workspace that is a link out of the root
    escaped.symlink_to(outside)
    return root, ws, outside


def both(root: Path, ws: Path, name: str, args: dict[str, object]) -> tuple[GuardResult | None, GuardResult]:
    local = readpolicy.decide(root, str(ws), name, args)
    guard = policy.check(Settings(root=root), GuardRequest(sid="s_1", workspace=str(ws),
                                                           call=CallSpec(call_id="c_1", name=name, args=args)))
    return local, guard


@pytest.mark.parametrize("name", sorted(readpolicy.READS))
def test_a_read_is_decided_in_the_runner_as_guard_decides_it(tree: tuple[Path, Path, Path], name: str) -> None:
    root, ws, outside = tree
    verdicts = set()
    for raw in READ_CASES:
        path = raw.format(outside=outside / "secret.txt")
        local, guard = both(root, ws, name, {"path": path})
        assert local == guard, (path, local, guard)
        assert local is not None
        verdicts.add(local.verdict)
    assert verdicts == {"allow", "refuse"}  # never a question: nothing here needs the person
    local, guard = both(root, ws, name, {})  # no path: the workspace itself
    assert local == guard and local is not None and (local.verdict, local.path) == ("allow", "")


def test_the_attacks_on_a_read_are_refused(tree: tuple[Path, Path, Path]) -> None:
    root, ws, outside = tree
    for path in ("../outside.txt", "/etc/passwd", str(outside / "secret.txt"), "link/secret.txt",
                 ".ssh/config", "sub/.env", "certs/server.pem", "deploy/id_rsa.pub", "envlink", "a\x00b"):
        got = readpolicy.decide(root, str(ws), "read_file", {"path": path})
        assert got is not None and (got.verdict, got.actor) == ("refuse", "policy"), (path, got)
    inside = readpolicy.decide(root, str(ws), "read_file", {"path": "innerlink/deep.txt"})
    assert inside is not None and (inside.verdict, inside.path) == ("allow", "sub/deep.txt")


def test_a_workspace_outside_the_root_refuses_every_call_it_decides(tree: tuple[Path, Path, Path]) -> None:
    root, _ws, _outside = tree
    escaped = root / "escaped"
    assert os.path.realpath(escaped) != str(escaped)
    for name in (*readpolicy.READS, *readpolicy.PROGRAM_CONTROL):
        local, guard = both(root, escaped, name, {"path": "secret.txt", "program_id": "p_1"})
        assert local == guard and local is not None and local.verdict == "refuse", (name, local)
    for name in readpolicy.NO_WORKSPACE:  # touches no file: allowed wherever the workspace is
        local, guard = both(root, escaped, name, {})
        assert local == guard and local is not None and local.verdict == "allow"


def test_every_call_that_changes_or_runs_something_goes_to_guard(tree: tuple[Path, Path, Path]) -> None:
    root, ws, _outside = tree
    for name, args in [("write_file", {"path": "notes.txt", "content": "x"}),
                       ("edit_file", {"path": "notes.txt", "old": "hello", "new": "bye"}),
                       ("run_command", {"command": "cat notes.txt"}), ("start_program", {"command": "sleep 9"}),
                       ("write_program", {"program_id": "p_1", "text": "ls\n"}), ("srv__search", {"q": "x"}),
                       ("attachment", {"name": "a.txt", "content": "x"}), ("no_such_tool", {})]:
        assert readpolicy.decide(root, str(ws), name, args) is None, name


def test_the_kernels_realpath_answers_as_pythons(tree: tuple[Path, Path, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``safefs.realpath`` (the kernel resolves an existing path) gives ``os.path.realpath``'s
    answer for every kind of path the pin meets: links in and out, loops, dangling links, paths
    that do not exist yet, a FIFO (which must not block), a deleted folder, relative paths."""
    from coxswain import safefs

    root, ws, _outside = tree
    os.mkfifo(ws / "fifo")
    (ws / "dangling").symlink_to(ws / "nowhere")
    gone = ws / "gone"
    gone.mkdir()
    (ws / "abs").symlink_to("/proc/self/root/etc")
    held = os.open(gone, os.O_PATH)
    try:
        gone.rmdir()
        monkeypatch.chdir(ws)
        paths = [str(ws / p) for p in ("", "notes.txt", "sub/", "sub/deep.txt", "link", "link/secret.txt",
                                       "innerlink/deep.txt", "loop", "loop/x", "dangling", "missing/a/b",
                                       "notes.txt/x", "fifo", "envlink", "abs", "abs/passwd", "sub/../link")]
        paths += ["sub", "./innerlink", "../ws/link", "", ".", f"/proc/self/fd/{held}", str(root / "escaped")]
        for p in paths:
            assert safefs.realpath(p) == os.path.realpath(p), p
    finally:
        os.close(held)
