"""safefs reads refuse what is not a regular file with a clear error (never an internal one)."""

from __future__ import annotations

import fnmatch
import os
import random
from pathlib import Path, PurePosixPath

import pytest

from coxswain import safefs
from coxswain.errors import CoxError


def test_reading_a_folder_is_a_clear_refusal(tmp_path: Path) -> None:
    """A command can turn a file into a folder; the versions service then reads the path and got
    IsADirectoryError (an internal error in versions.after) instead of "is a folder"."""
    (tmp_path / "was-a-file").mkdir()
    with pytest.raises(CoxError, match="is a folder"):
        safefs.read(tmp_path, "was-a-file")


def test_reading_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(CoxError, match="not a regular file"):
        safefs.read(tmp_path, "pipe")


def test_a_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert safefs.read(tmp_path, "nothing-here") is None


def _matches_reference(rel: str, patterns: tuple[str, ...]) -> str | None:
    """The denylist's match as it was written first (a path pattern, else fnmatch on every part)."""
    parts = PurePosixPath(rel).parts
    for pat in patterns:
        if "/" in pat:
            if rel == pat or rel.startswith(pat + "/"):
                return pat
            continue
        for part in parts:
            if fnmatch.fnmatchcase(part, pat):
                return pat
    return None


def test_the_denylist_match_answers_as_a_loop_over_every_pattern_and_part() -> None:
    """The match runs for every read a model makes: one expression over the parts answers the
    usual case. It names the same entry as a plain loop for paths built from the entries
    themselves, near misses, case changes, dots, empty parts and absolute paths."""
    rng = random.Random(7)
    pieces = ["src", "a.py", ".ssh", ".SSH", "id_rsa", "id_rsa.pub", "x.pem", "pem", ".env", ".env.local",
              "prod.env", "env", ".envrc", ".config", "gcloud", ".config/gcloud", "key", "k.key", "keys", ".",
              "", "..", "ssh", ".git-credentials", ".netrc2", "*", "[x]", "a b", "é.key", "docker", ".docker"]
    for _ in range(5000):
        rel = "/".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
        if rng.random() < 0.1:
            rel = "/" + rel
        assert safefs._matches(rel, safefs.CREDENTIAL_DENYLIST) == _matches_reference(rel, safefs.CREDENTIAL_DENYLIST), rel
    others = ("*", "?", "a/b", "[ab]*", "*.[ch]")
    for rel in ("a", "a/b", "a/b/c", "ab", "x.c", "/", "//x", "/a/b", "c", ""):
        assert safefs._matches(rel, others) == _matches_reference(rel, others), rel


def test_a_resolved_path_is_relative_to_the_real_root(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / "link").symlink_to(root / "a")
    (tmp_path / "out").mkdir()
    (root / "escape").symlink_to(tmp_path / "out")
    assert safefs.resolve(root, ".") == "" and safefs.resolve(root, "a/b/") == "a/b"
    assert safefs.resolve(root, "link/b") == "a/b" and safefs.resolve(root, str(root / "a")) == "a"
    assert safefs.resolve(root, "a/../a/./b") == "a/b" and safefs.resolve(root, "new/file") == "new/file"
    for outside in ("escape", "..", "../ws2", str(tmp_path / "out"), "/etc"):
        with pytest.raises(CoxError, match="outside the workspace"):
            safefs.resolve(root, outside)
    with pytest.raises(CoxError, match="too deep"):
        safefs.resolve(root, "/".join(["d"] * (safefs.MAX_DEPTH + 1)))
    assert safefs.resolve(root, "/".join(["d"] * safefs.MAX_DEPTH)) == "/".join(["d"] * safefs.MAX_DEPTH)


def test_a_workspace_under_the_root_is_its_real_path(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "w").mkdir(parents=True)
    (tmp_path / "rootish").mkdir()
    (root / "link").symlink_to(tmp_path / "rootish")
    assert safefs.real_under(root, root / "w") == root / "w" and safefs.real_under(root, root) == root
    assert safefs.real_under(root, tmp_path / "rootish") is None, "a sibling whose name starts like the root's"
    assert safefs.real_under(root, root / "link") is None, "a link out of the root"
    assert safefs.real_under("/", tmp_path) == tmp_path, "everything is under /"
