"""Error details a client reads name no host path (issue 21 item 7): an unexpected exception's
description, git's own messages (with a real git), the gateway's last fence."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis.exceptions

from cox_versions import gitrepo
from coxswain.errors import describe, logged, without_paths


def test_an_oserror_is_described_without_its_file_names(tmp_path: Path) -> None:
    with pytest.raises(OSError) as info:
        (tmp_path / "no" / "such").read_text()
    text = describe(info.value)
    assert text == "FileNotFoundError: No such file or directory" and str(tmp_path) not in text
    assert "<path>" in describe(ValueError(f"bad thing at {tmp_path}/x.y"))
    two = OSError(13, "Permission denied", str(tmp_path / "a"), None, str(tmp_path / "b"))
    assert str(tmp_path) not in describe(two)


def test_a_logged_error_keeps_its_message_where_its_repr_drops_it() -> None:
    """redis-py's errors repr as ``network:ConnectionError`` whatever went wrong: a log line of
    one says why it failed too."""
    down = redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    assert "Connection refused" not in repr(down), "redis-py keeps the message in its repr now"
    assert logged(down) == "network:ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection refused."
    script = redis.exceptions.ResponseError("ERR fenced: token t_1 is not the lease's")
    assert logged(script).endswith(": ERR fenced: token t_1 is not the lease's")
    assert logged(ValueError("bad")) == "ValueError('bad')", "a repr that holds the message is kept as it is"
    assert logged(TimeoutError()) == "TimeoutError()"

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert logged(Unprintable()) == "Unprintable()"


def test_paths_under_a_root_are_said_relative_to_it(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    assert without_paths(f"cannot open {root}/w/a.txt", root) == "cannot open w/a.txt"
    assert without_paths(f"{root} is the root", root) == ". is the root"
    assert without_paths("error: '/etc/shadow' is not readable") == "error: '<path>' is not readable"


def test_a_git_failure_names_files_relative_to_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    with pytest.raises(gitrepo.GitError) as info:
        gitrepo.run(["cat-file", "-p", "HEAD:nothing"], ws, {"GIT_DIR": str(ws / ".git")})
    assert str(tmp_path) not in str(info.value)
    with pytest.raises(gitrepo.GitError) as info:
        gitrepo.run(["rev-parse", "HEAD"], ws, {"GIT_DIR": str(tmp_path / "elsewhere" / "missing.git")})
    assert str(tmp_path) not in str(info.value) and "not a git repository" in str(info.value), str(info.value)
