"""Versions and the Changes view, through HTTP against a real stack.

Keep before every write (git-aware), list, diff (numbered, deletion/empty/oversized as flags),
restore and undo as writes, command snapshots (what ``run_command`` changed is kept and can be
undone), an untrusted store (tampered objects and forged index lines are refused, not served),
fencing tokens, and ``GET /changes`` (the latest approved preview per file).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import nats
import redis

from cox_versions.changes import build as build_changes
from coxswain import subjects
from coxswain.models import PREVIEW_LABEL, KeepRequest, RestoreRequest
from tests.support.flow import answer, call_ids, final_decision, next_approval, result, run_turn
from tests.support.library import Library
from tests.support.stack import Api, Stack, script, stack_fixture

CONFIG = """
[approval]
commands = "allow"
"""


stack = stack_fixture("versions", runners=1, config=CONFIG)


def write(path: str, content: str) -> dict[str, Any]:
    return {"name": "write_file", "args": {"path": path, "content": content}}


def cmd(command: str) -> dict[str, Any]:
    return {"name": "run_command", "args": {"command": command}}


def versions(api: Api, sid: str, path: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/v1/sessions/{sid}/versions", params={"path": path})
    assert r.status_code == 200, r.text
    return list(r.json()["versions"])


def diff(api: Api, sid: str, vid: str) -> Any:
    return api.http.get(f"/v1/sessions/{sid}/versions/{vid}/diff")


def lines(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [ln for h in d["hunks"] for ln in h["lines"]]


def git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=ws, check=True,
                          capture_output=True, text=True).stdout


# ------------------------------------------------------------------ keep, list, diff, restore, undo


def test_keep_list_diff_restore_undo(stack: Stack, api: Api) -> None:
    s = api.create("v-basic")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "a.txt").write_text("one\ntwo\nthree\n")
    evs = run_turn(api, sid, script({"tools": [write("a.txt", "one\nTWO\nthree\nfour\n")]}, {"text": "ok"}))
    kept = next(e for e in evs if e["type"] == "version.kept")
    written = next(e for e in evs if e["type"] == "file.written")
    assert kept["store"] == "versions" and kept["path"] == "a.txt"
    assert (written["added"], written["removed"]) == (2, 1)
    vs = versions(api, sid, "a.txt")
    assert [v["version_id"] for v in vs] == [kept["version_id"]] and vs[0]["reason"] == "write"
    d = diff(api, sid, kept["version_id"]).json()
    assert (d["added"], d["removed"], d["deleted"], d["empty"], d["oversized"]) == (2, 1, False, False, False)
    assert {"op": "-", "old": 2, "new": None, "text": "two"} in lines(d)
    assert {"op": "+", "old": None, "new": 4, "text": "four"} in lines(d)
    assert "-two\n" in d["diff"] and "+four\n" in d["diff"]

    r = api.http.post(f"/v1/sessions/{sid}/versions/{kept['version_id']}/restore")
    assert r.status_code == 200, r.text
    assert (ws / "a.txt").read_text() == "one\ntwo\nthree\n"
    out = r.json()
    assert out["restored_from"] == kept["version_id"] and out["kept"]["existed"] is True
    vs = versions(api, sid, "a.txt")
    assert [v["reason"] for v in vs] == ["restore", "write"], "a restore keeps the current content first"
    restore_evs = [e for e in api.all_events(sid) if e["type"] == "file.written" and e.get("via") == "restore"]
    assert restore_evs and (restore_evs[0]["added"], restore_evs[0]["removed"]) == (1, 2)

    # Undo puts back the latest write (the restore), then the model's write, then nothing is left.
    assert api.http.post(f"/v1/sessions/{sid}/undo").status_code == 200
    assert (ws / "a.txt").read_text() == "one\nTWO\nthree\nfour\n"
    assert api.http.post(f"/v1/sessions/{sid}/undo").status_code == 200
    assert (ws / "a.txt").read_text() == "one\ntwo\nthree\n"
    r = api.http.post(f"/v1/sessions/{sid}/undo")
    assert r.status_code == 404 and r.json()["error"] == "not_found"


def test_diff_flags_deleted_empty_oversized(stack: Stack, api: Api) -> None:
    s = api.create("v-flags")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "big.txt").write_bytes(b"a" * 3_000_000)
    evs = run_turn(api, sid, script(
        {"tools": [write("gone.txt", "g1\ng2\n"), write("gone.txt", "g3\n"), write("same.txt", "x\n"),
                   write("same.txt", "y\n"), write("big.txt", "small\n")]},
        {"tools": [cmd("rm gone.txt")]},
        {"text": "ok"},
    ))
    kept = [e for e in evs if e["type"] == "version.kept"]
    by_path: dict[str, list[str]] = {}
    for k in kept:
        by_path.setdefault(k["path"], []).append(k["version_id"])
    gone = diff(api, sid, by_path["gone.txt"][1]).json()  # the version "g1\ng2\n" vs a deleted file
    assert gone["deleted"] is True and gone["removed"] == 2 and gone["added"] == 0
    r = api.http.post(f"/v1/sessions/{sid}/versions/{by_path['same.txt'][1]}/restore")  # back to "x\n"
    assert r.status_code == 200
    same = diff(api, sid, by_path["same.txt"][1]).json()
    assert same["empty"] is True and same["diff"] == "" and same["hunks"] == []
    big = diff(api, sid, by_path["big.txt"][0]).json()
    assert big["oversized"] is True and big["diff"] == "" and big["hunks"] == []


def test_git_keeps_committed_unchanged_files_and_the_store_stays_out_of_git_status(stack: Stack, api: Api) -> None:
    s = api.create("v-git")
    sid, ws = s["id"], Path(s["workspace"])
    git(ws, "init", "-q")
    (ws / "tracked.txt").write_text("committed\n")
    (ws / "modified.txt").write_text("committed\n")
    (ws / ".gitignore").write_text("*.log\n")
    git(ws, "add", ".")
    git(ws, "commit", "-qm", "base")
    (ws / "modified.txt").write_text("changed, not committed\n")
    (ws / "untracked.txt").write_text("new\n")
    (ws / "ignored.log").write_text("log\n")
    evs = run_turn(api, sid, script({"tools": [write(p, f"model wrote {p}\n") for p in
                                               ("tracked.txt", "modified.txt", "untracked.txt", "ignored.log")]},
                                    {"text": "ok"}))
    stores = {e["path"]: e["store"] for e in evs if e["type"] == "version.kept"}
    assert stores == {"tracked.txt": "git", "modified.txt": "versions", "untracked.txt": "versions",
                      "ignored.log": "versions"}
    status = git(ws, "status", "--porcelain")
    assert ".coxswain" not in status, status
    assert "!! .coxswain/" in git(ws, "status", "--porcelain", "--ignored"), "ignored through its own .gitignore"
    assert (ws / ".coxswain" / ".gitignore").exists()
    vid = next(e["version_id"] for e in evs if e["type"] == "version.kept" and e["path"] == "tracked.txt")
    d = diff(api, sid, vid).json()
    assert d["store"] == "git" and {"op": "-", "old": 1, "new": None, "text": "committed"} in lines(d)
    assert api.http.post(f"/v1/sessions/{sid}/versions/{vid}/restore").status_code == 200
    assert (ws / "tracked.txt").read_text() == "committed\n"
    assert git(ws, "status", "--porcelain", "tracked.txt") == ""


# ------------------------------------------------------------------ an untrusted store


def test_a_tampered_object_is_refused_not_served(stack: Stack, api: Api) -> None:
    s = api.create("v-tamper")
    sid, ws = s["id"], Path(s["workspace"])
    original = b"the original content\n"
    (ws / "a.txt").write_bytes(original)
    evs = run_turn(api, sid, script({"tools": [write("a.txt", "the model's content\n")]}, {"text": "ok"}))
    vid = next(e["version_id"] for e in evs if e["type"] == "version.kept")
    digest = hashlib.sha256(original).hexdigest()
    obj = ws / ".coxswain" / "objects" / digest[:2] / digest
    assert obj.read_bytes() == original
    os.chmod(obj, 0o644)
    obj.write_bytes(b"planted content\n")
    for r in (diff(api, sid, vid), api.http.post(f"/v1/sessions/{sid}/versions/{vid}/restore")):
        assert r.status_code == 403, r.text
        body = r.json()
        assert body["error"] == "refused" and "tampered" in body["detail"]
        assert "planted" not in r.text
    assert (ws / "a.txt").read_text() == "the model's content\n"


def test_forged_or_edited_index_lines_are_not_records(stack: Stack, api: Api) -> None:
    s = api.create("v-forge")
    sid, ws = s["id"], Path(s["workspace"])
    evs = run_turn(api, sid, script({"tools": [write("a.txt", "v1\n")]}, {"text": "ok"}))
    real = next(e["version_id"] for e in evs if e["type"] == "version.kept")
    index = ws / ".coxswain" / "index.jsonl"
    line = json.loads(index.read_text().splitlines()[0])
    forged = {**line, "version_id": "v_forged0000000000000000", "path": "a.txt"}  # MAC no longer holds
    edited = {**line, "path": "b.txt"}
    unsigned = {k: v for k, v in line.items() if k != "mac"} | {"version_id": "v_unsigned00000000000000"}
    with index.open("a") as fh:
        for d in (forged, edited, unsigned):
            fh.write(json.dumps(d) + "\n")
        fh.write("{not json\n")
    assert [v["version_id"] for v in versions(api, sid, "a.txt")] == [real]
    assert versions(api, sid, "b.txt") == []
    for vid in ("v_forged0000000000000000", "v_unsigned00000000000000"):
        r = diff(api, sid, vid)
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert diff(api, sid, real).status_code == 200


def test_writes_with_a_stale_fencing_token_are_refused(stack: Stack, api: Api) -> None:
    s = api.create("v-fence")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "a.txt").write_text("keep me\n")
    run_turn(api, sid, script({"tools": [write("a.txt", "x\n")]}, {"text": "ok"}))
    vid = versions(api, sid, "a.txt")[0]["version_id"]

    async def rpc(op: str, body: bytes) -> dict[str, Any]:
        nc = await nats.connect(stack.nats.admin_url)
        try:
            msg = await nc.request(subjects.rpc(subjects.VERSIONS, op), body, timeout=10)
            return dict(json.loads(msg.data))
        finally:
            await nc.close()

    keep = KeepRequest(sid=sid, workspace=str(ws), path="a.txt", token=987654).model_dump_json().encode()
    restore = RestoreRequest(sid=sid, workspace=str(ws), version_id=vid, token=987654).model_dump_json().encode()
    for op, body in (("keep", keep), ("restore", restore)):
        reply = asyncio.run(rpc(op, body))
        assert reply["ok"] is False and reply["error"] == "fenced", reply
    assert (ws / "a.txt").read_text() == "x\n"


# ------------------------------------------------------------------ what a command changes


def test_a_command_that_deletes_a_file_is_versioned_and_undone(stack: Stack, api: Api) -> None:
    s = api.create("v-command")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "gone.txt").write_text("g1\ng2\n")
    (ws / "edit.txt").write_text("e\n")
    (ws / "same.txt").write_text("s\n")
    (ws / ".env").write_text("SECRET=1\n")
    evs = run_turn(api, sid, script(
        {"tools": [cmd("rm gone.txt && echo more >> edit.txt && echo new > made.txt && rm .e?v")]},
        {"text": "ok"}))
    cid = call_ids(evs, "run_command")[0]
    assert result(evs, cid)["ok"] is True
    res_seq = result(evs, cid)["seq"]
    written = {e["path"]: e for e in evs if e["type"] == "file.written"}
    kept = {e["path"]: e for e in evs if e["type"] == "version.kept"}
    assert set(written) == set(kept) == {"gone.txt", "edit.txt", "made.txt"}, "the denylist is never versioned"
    assert all(e["via"] == "command" and e["seq"] < res_seq for e in written.values())
    assert written["gone.txt"]["deleted"] is True and written["gone.txt"]["removed"] == 2
    assert (written["edit.txt"]["added"], written["edit.txt"]["removed"]) == (1, 0)
    assert kept["made.txt"]["store"] == "absent"
    vs = versions(api, sid, "gone.txt")
    assert vs[0]["reason"] == "command" and vs[0]["call_id"] == cid
    d = diff(api, sid, kept["gone.txt"]["version_id"]).json()
    assert d["deleted"] is True and {"op": "-", "old": 1, "new": None, "text": "g1"} in lines(d)

    r = api.http.post(f"/v1/sessions/{sid}/undo")
    assert r.status_code == 200, r.text
    assert sorted(f["path"] for f in r.json()["files"]) == ["edit.txt", "gone.txt", "made.txt"]
    assert (ws / "gone.txt").read_text() == "g1\ng2\n"
    assert (ws / "edit.txt").read_text() == "e\n"
    assert not (ws / "made.txt").exists()
    assert (ws / "same.txt").read_text() == "s\n"
    undo_evs = [e for e in api.all_events(sid) if e["type"] == "file.written" and e.get("via") == "undo"]
    assert len(undo_evs) == 3


# ------------------------------------------------------------------ the Changes view


def test_changes_lists_the_latest_approved_preview_per_file(stack: Stack, api: Api) -> None:
    s = api.create("v-changes")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "a.txt").write_text("1\n2\n3\n")
    r = api.send(sid, script({"tools": [write("a.txt", "1\ntwo\n3\n"), write("b.txt", "b\n"),
                                        write("a.txt", "1\ntwo\n3\n4\n"), write(".env", "X=1"),
                                        write("Makefile", "all:\n")]},
                             {"text": "ok"}))
    assert r.status_code == 202
    pending = next_approval(api, sid)  # Makefile: a security confirm, denied
    answer(api, sid, pending["approval_id"], "deny")
    api.wait_type(sid, "turn.end")
    # An older record without detail: a write decision recorded before previews existed.
    rc = redis.Redis.from_url(stack.redis.admin_url, decode_responses=True)
    old_call = {"type": "tool.call", "sid": sid, "call_id": "call_legacy1", "name": "write_file",
                "args": {"path": "old.txt", "content": "o"}}
    old_decision = {"type": "policy.decision", "sid": sid, "call_id": "call_legacy1", "verdict": "allow",
                    "actor": "setting", "reason": "writes go ahead"}
    lib = Library(rc)  # recorded without a lease (token ''), as a runner records outside a turn
    lib(lib.fns.emit(sid=sid, token="", owner="", ops=[], events=[json.dumps(old_call), json.dumps(old_decision)]))
    rc.close()
    api.wait_type(sid, "policy.decision", call_id="call_legacy1")

    r = api.http.get(f"/v1/sessions/{sid}/changes")
    assert r.status_code == 200, r.text
    files = r.json()["files"]
    assert [f["path"] for f in files] == ["old.txt", "a.txt", "b.txt"], "newest first; refused and denied left out"
    old, a, b = files
    assert old["available"] is False and old["note"] == "preview unavailable" and old["preview"] is None
    for f in (a, b):
        assert f["label"] == PREVIEW_LABEL == "Approved preview — not proof of a successful write"
        assert f["available"] is True and f["actor"] == "setting"
    assert (a["preview"]["added"], a["preview"]["removed"]) == (1, 0), "the latest preview of a.txt"
    assert {"op": "+", "old": None, "new": 4, "text": "4"} in [ln for h in a["preview"]["hunks"] for ln in h["lines"]]
    assert b["preview"]["created"] is True
    evs = api.all_events(sid)
    a_calls = [c for c in call_ids(evs, "write_file")][:3]
    assert a["call_id"] == a_calls[2] and final_decision(evs, a_calls[2])["preview"] == a["preview"]


def test_changes_units() -> None:
    evs = [
        {"seq": 1, "type": "tool.call", "call_id": "c1", "name": "write_file", "args": {"path": "x"}},
        {"seq": 2, "type": "policy.decision", "call_id": "c1", "verdict": "ask", "actor": "setting",
         "name": "write_file", "path": "x", "preview": {"added": 1}},
        {"seq": 3, "type": "policy.decision", "call_id": "c1", "verdict": "allow", "actor": "person",
         "name": "write_file", "path": "x"},
        {"seq": 4, "type": "tool.call", "call_id": "c2", "name": "run_command", "args": {"command": "ls"}},
        {"seq": 5, "type": "policy.decision", "call_id": "c2", "verdict": "allow", "actor": "setting"},
    ]
    out = build_changes(evs).files
    assert [(f.path, f.actor, f.seq, f.available) for f in out] == [("x", "person", 3, True)]
    assert out[0].preview == {"added": 1}, "the preview recorded with guard's decision of the same call"


def test_a_planted_shadow_config_never_runs(tmp_path: Path) -> None:
    """The shadow's config sits where commands can write; it is rewritten before every use."""
    from cox_versions.shadow import Shadow

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    shadow = Shadow(ws, ".coxswain")
    tree, _ = shadow.snapshot("s_one")
    marker = tmp_path / "pwned"
    cfg = ws / ".coxswain" / "shadow" / "config"
    with cfg.open("a") as fh:
        fh.write(f"[core]\n\tfsmonitor = touch {marker}\n\thooksPath = {tmp_path}\n")
    (ws / ".gitattributes").write_text("* filter=evil\n")
    with cfg.open("a") as fh:
        fh.write(f"[filter \"evil\"]\n\tclean = touch {marker}\n")
    (ws / "a.txt").write_text("b\n")
    _, changes, _ = shadow.changes("s_one", tree)
    assert not marker.exists()
    assert {c.path for c in changes} == {"a.txt", ".gitattributes"}
    assert shadow.read(next(c.old_oid for c in changes if c.path == "a.txt"), 100) == b"a\n"
