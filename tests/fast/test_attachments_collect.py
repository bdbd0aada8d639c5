"""Collecting attachment blobs no message named (``coxswain.attachments.collect``), on a folder."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from coxswain import attachments as att

TTL = 86_400.0
NOW = 2_000_000_000.0


def blob(root: Path, data: bytes, age: float) -> str:
    sha, _ = att.keep(root, ".coxswain", [data])
    os.utime(att.blob(root, ".coxswain", sha), (NOW - age, NOW - age))
    return sha


def test_blobs_there_before_marks_existed_are_all_kept(tmp_path: Path) -> None:
    # written as an older version wrote blobs: no kept folder
    before = hashlib.sha256(b"from an older version").hexdigest()
    legacy = att.blob(tmp_path, ".coxswain", before)
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"from an older version")
    os.utime(legacy, (NOW - TTL * 10, NOW - TTL * 10))
    assert att.collect(tmp_path, ".coxswain", TTL, NOW) == [], "a message may name it: kept"
    assert att.blob(tmp_path, ".coxswain", before).exists()
    later = blob(tmp_path, b"unnamed, after marks", TTL * 10)
    assert att.collect(tmp_path, ".coxswain", TTL, NOW) == [later]


def test_only_old_unnamed_blobs_go(tmp_path: Path) -> None:
    att.ensure_kept(tmp_path, ".coxswain")
    old = blob(tmp_path, b"old", TTL + att.COLLECT_GRACE_S + 5)
    in_grace = blob(tmp_path, b"in the grace", TTL + att.COLLECT_GRACE_S - 5)
    named = blob(tmp_path, b"named", TTL * 3)
    att.mark_kept(tmp_path, ".coxswain", [named, "not-a-digest"])
    assert att.collect(tmp_path, ".coxswain", TTL, NOW) == [old]
    left = {p.name for p in att.folder(tmp_path, ".coxswain").iterdir()}
    assert left == {in_grace, named, att.KEPT}
    assert hashlib.sha256(b"named").hexdigest() == named


def test_collecting_with_nothing_uploaded_makes_no_folder_under_the_root(tmp_path: Path) -> None:
    """The collector runs on every runner from its start: on a root nothing was uploaded to it
    must leave no ``.coxswain`` behind (the root's store folder is no workspace, and tests of the
    root's tree see it)."""
    assert att.collect(tmp_path, ".coxswain", 60.0, time.time()) == []
    assert list(tmp_path.iterdir()) == []
