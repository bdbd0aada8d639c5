"""The archive's pure parts (no server): which keys a snapshot holds, an entry's encoding, and
the API's view of an archived session built from a snapshot."""

from __future__ import annotations

import json

from coxswain import archive, keys
from coxswain.config import SandboxConfig


def test_the_snapshot_holds_every_session_key_but_the_transient_ones() -> None:
    """A key the session gains (a new suffix in keys.py) must be archived, or be one of the few
    an archivable session has empty or that expire by themselves: otherwise a reload loses it."""
    suffixes = {v for k, v in vars(keys).items() if k.isupper() and isinstance(v, str) and v.startswith(":")}
    # the program lock: an archivable session has none (unarchivable() refuses while it exists)
    transient = {keys.LEASE, keys.OUTBOX, keys.PUBLOCK, keys.PUBHW, keys.TX, keys.PROGRAM_LOCK}
    assert suffixes - transient == set(keys.ARCHIVED) - {""}, \
        f"not archived: {sorted(suffixes - transient - set(keys.ARCHIVED))}"
    assert "" in keys.ARCHIVED and len(set(keys.ARCHIVED)) == len(keys.ARCHIVED)
    # the activity index is on the session's bucket: its own slot's calls reach it
    assert keys.tag(keys.bucket("s_x")) in keys.active(keys.bucket("s_x"))


def _entry() -> archive.Entry:
    snap = [
        ["", "hash", ["busy", "0", "created", "5", "model", "script", "principal", "p", "seq", "9",
                      "title", "T", "title_source", "manual", "usage_requests", "3", "workspace", "/w"]],
        [keys.LEADS, "hash", ["l_1", json.dumps({"lead_id": "l_1", "text": "x", "state": "unapplied"})]],
        [keys.APPROVALS, "hash", ["a_1", json.dumps({"approval_id": "a_1", "state": "resolved"})]],
        [keys.STANDING, "set", ["git status", "network"]],
    ]
    record = {"v": 1, "sid": "s_x", "principal": "p", "seq": 9, "sha": "0" * 40, "archived": 1, "keys": snap}
    value = archive.encode(record)
    assert archive.decode(value) == record
    return archive.Entry(record=archive.decode(value), revision=4)


def test_an_archived_session_reads_as_the_session_object() -> None:
    entry = _entry()
    assert entry.seq == 9 and archive.hash_of(entry)["workspace"] == "/w"
    view = archive.view(entry, "p", SandboxConfig())
    assert view is not None
    assert (view.id, view.title, view.model, view.last_seq, view.busy) == ("s_x", "T", "script", 9, False)
    assert view.usage.requests == 3 and [x.lead_id for x in view.leads] == ["l_1"]
    assert view.approvals == [] and view.standing == ["git status", "network"]
    assert view.sandbox is not None and view.sandbox.network in ("on", "session")
    assert archive.view(entry, "someone-else") is None
