"""The Changes view: the latest change per file in a session (docs/design.md, "Versions").

The source is the session's event log, not the workspace: the log is written only by the
runner holding the session's lease (through Redis), so a command cannot forge or edit a preview
the way it could a file in the store folder.

Two kinds of record, the latest per path wins:

- an approved ``write_file``: guard's ``policy.decision`` of a write carries its preview
  (:func:`coxswain.textdiff.preview`; a later decision of the same call by the judge, the person
  or the don't-ask switch refers to it by ``call_id``); the latest *allowing* decision is listed,
  labelled as an approved preview: guard decides before the write runs, so it is not proof that
  the write happened. A decision recorded without a preview says "preview unavailable"; nothing
  is computed from the current file to stand in for it.
- a write the log records as ``file.written`` by a command, a restore or an undo: every one is
  versioned first (``version.kept`` of the same path just before it), so the entry names that
  version; its diff is the kept version → the file now, which a client asks for by id.
"""

from __future__ import annotations

from typing import Any

from coxswain.models import PREVIEW_UNAVAILABLE, WRITTEN_LABEL, ChangeEntry, ChangesResult

NOT_TOOL = ("command", "restore", "undo", "rewind")
WRITE_TOOLS = ("write_file", "edit_file")
"""Tools whose allowed decision carries the preview of a write (guard computes it for both)."""


def build(events: list[dict[str, Any]]) -> ChangesResult:
    write_paths: dict[str, str] = {}
    previews: dict[str, dict[str, Any]] = {}
    kept: dict[str, str] = {}
    latest: dict[str, ChangeEntry] = {}
    for e in events:
        kind = e.get("type")
        if kind == "tool.call" and e.get("name") in WRITE_TOOLS:
            args = e.get("args")
            if isinstance(args, dict) and isinstance(args.get("path"), str):
                write_paths[str(e.get("call_id"))] = args["path"]
            continue
        if kind == "version.kept" and isinstance(e.get("path"), str):
            kept[e["path"]] = str(e.get("version_id"))
            continue
        if kind == "file.written" and e.get("via") in NOT_TOOL and isinstance(e.get("path"), str):
            path = e["path"]
            latest.pop(path, None)
            latest[path] = ChangeEntry(
                path=path, call_id="", turn_id=e.get("turn_id"), seq=int(e.get("seq", 0)), ts=int(e.get("ts", 0)),
                actor="person" if e.get("via") in ("restore", "undo", "rewind") else "command", label=WRITTEN_LABEL,
                available=False, via=e["via"], version_id=kept.get(path), added=e.get("added"),
                removed=e.get("removed"), deleted=bool(e.get("deleted")),
            )
            continue
        if kind != "policy.decision":
            continue
        call_id = str(e.get("call_id"))
        if isinstance(e.get("preview"), dict):
            previews.setdefault(call_id, e["preview"])
        if e.get("verdict") != "allow":
            continue
        if (e.get("name") is not None and e.get("name") not in WRITE_TOOLS) or (e.get("name") is None and call_id not in write_paths):
            continue
        path = e.get("path") or write_paths.get(call_id)
        if not isinstance(path, str):
            continue
        preview = previews.get(call_id)
        available = preview is not None
        latest.pop(path, None)
        latest[path] = ChangeEntry(
            path=path, call_id=call_id, turn_id=e.get("turn_id"), seq=int(e.get("seq", 0)), ts=int(e.get("ts", 0)),
            actor=str(e.get("actor", "")), available=available, preview=preview if available else None,
            note=None if available else PREVIEW_UNAVAILABLE,
        )
    files = sorted(latest.values(), key=lambda c: c.seq, reverse=True)
    return ChangesResult(files=files)
