"""The Changes view: the latest recorded approval preview per file (docs/design.md, "Versions").

The source is the session's event log, not the workspace: the log is written only by the
runner holding the session's lease (through Redis), so a command cannot forge or edit a preview
the way it could a file in the store folder. Guard's ``policy.decision`` of a write carries its
preview (:func:`coxswain.textdiff.preview`; a later decision of the same call by the judge, the
person or the don't-ask switch refers to it by ``call_id``); the latest *allowing* decision per
path is listed,
newest first, labelled as an approved preview: guard decides before the write runs, so it is not
proof that the write happened. A decision recorded without a preview (an older record) says
"preview unavailable"; nothing is computed from the current file to stand in for it.
"""

from __future__ import annotations

from typing import Any

from coxswain.models import PREVIEW_UNAVAILABLE, ChangeEntry, ChangesResult


def build(events: list[dict[str, Any]]) -> ChangesResult:
    write_paths: dict[str, str] = {}
    previews: dict[str, dict[str, Any]] = {}
    latest: dict[str, ChangeEntry] = {}
    for e in events:
        kind = e.get("type")
        if kind == "tool.call" and e.get("name") == "write_file":
            args = e.get("args")
            if isinstance(args, dict) and isinstance(args.get("path"), str):
                write_paths[str(e.get("call_id"))] = args["path"]
            continue
        if kind != "policy.decision":
            continue
        call_id = str(e.get("call_id"))
        if isinstance(e.get("preview"), dict):
            previews.setdefault(call_id, e["preview"])
        if e.get("verdict") != "allow":
            continue
        if e.get("name") not in (None, "write_file") or (e.get("name") is None and call_id not in write_paths):
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
