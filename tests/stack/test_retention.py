"""Retention of the versions store and the shadow (``[versions] keep_days``, ``keep_per_file``), against a real stack.

Versions are made by real turns; their ages are then set by rewriting their index lines with the
store's own MAC key (read from Redis as the admin user), which is what a store written over
weeks would hold. The collection runs through its real operation (``cox.rpc.versions.collect``,
sent as NATS admin), and restore, diff and undo are checked over HTTP afterwards.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import redis

from cox_versions.store import Store
from coxswain import keys, rpc
from coxswain.models import CollectRequest
from tests.support.flow import run_turn
from tests.support.stack import Api, Stack, script, stack_fixture

CONFIG = """
[approval]
commands = "allow"

[versions]
keep_days = 10
keep_per_file = 2
"""
DAY = 86_400.0

stack = stack_fixture("retention", runners=1, config=CONFIG)


def write(path: str, content: str) -> dict[str, Any]:
    return {"name": "write_file", "args": {"path": path, "content": content}}


def cmd(command: str) -> dict[str, Any]:
    return {"name": "run_command", "args": {"command": command}}


def collect(stack: Stack, ws: Path | None = None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        nc = await nats.connect(stack.nats.admin_url)
        try:
            body = CollectRequest(workspace=str(ws) if ws else None).model_dump_json().encode()
            msg = await nc.request(rpc.VERSIONS_COLLECT.subject, body, timeout=60)
            return dict(json.loads(msg.data))
        finally:
            await nc.close()

    reply = asyncio.run(go())
    assert reply["ok"] is True, reply
    return dict(reply["result"])


def store_of(stack: Stack, ws: Path) -> Store:
    rc = redis.Redis.from_url(stack.redis.admin_url, decode_responses=True)
    try:
        hex_key = rc.get(keys.VERSIONS_MAC_KEY)
        assert isinstance(hex_key, str), "the versions service has set its MAC key"
        key = bytes.fromhex(hex_key)
    finally:
        rc.close()
    return Store(ws.resolve(), ".coxswain", key)


def age(stack: Stack, ws: Path, created: dict[str, float]) -> None:
    """Give versions the creation times ``created`` (version id -> seconds), signed as the store signs."""
    st = store_of(stack, ws)
    index = ws / ".coxswain" / "index.jsonl"
    out = []
    for line in index.read_text().splitlines():
        d = json.loads(line)
        d.pop("mac")
        if d.get("version_id") in created:
            d["created"] = created[d["version_id"]]
        out.append(st._line(d))
    index.write_text("".join(ln + "\n" for ln in out))


def versions(api: Api, sid: str, path: str) -> list[str]:
    r = api.http.get(f"/v1/sessions/{sid}/versions", params={"path": path})
    assert r.status_code == 200, r.text
    return [v["version_id"] for v in r.json()["versions"]]


def objects(ws: Path) -> set[str]:
    return {p.name for p in (ws / ".coxswain" / "objects").glob("*/*")}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_collection_keeps_what_the_policy_says_and_kept_versions_still_restore(stack: Stack, api: Api) -> None:
    s = api.create("r-policy")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "a.txt").write_text("orig\n")
    (ws / "b.txt").write_text("b0\n")
    evs = run_turn(api, sid, script({"tools": [write("b.txt", "b1\n"), write("a.txt", "one\n"),
                                               write("a.txt", "two\n"), write("a.txt", "orig\n"),
                                               write("a.txt", "four\n"), write("a.txt", "five\n")]},
                                    {"text": "ok"}))
    kept = [e for e in evs if e["type"] == "version.kept"]
    b, v1, v2, v3, v4, v5 = (k["version_id"] for k in kept)
    assert [k["path"] for k in kept] == ["b.txt"] + ["a.txt"] * 5
    # v1 and v4 both hold "orig\n": one object, shared.
    assert objects(ws) == {sha("b0\n"), sha("orig\n"), sha("one\n"), sha("two\n"), sha("four\n")}

    now = time.time()
    age(stack, ws, {b: now - 100 * DAY, v1: now - 30 * DAY, v2: now - 20 * DAY, v3: now - 15 * DAY,
                    v4: now - 12 * DAY, v5: now - 1 * DAY})
    res = collect(stack, ws)
    # a.txt: v5 (young) and v4 (second newest) stay; v1..v3 are outside both rules.
    # b.txt: older than keep_days, but the newest of its file.
    assert (res["workspaces"], res["versions_kept"], res["versions_removed"]) == (1, 3, 3), res
    assert res["objects_removed"] == 2 and res["bytes_freed"] == len("one\n") + len("two\n"), res
    assert objects(ws) == {sha("b0\n"), sha("orig\n"), sha("four\n")}, "the shared object stays with v4"
    assert versions(api, sid, "a.txt") == [v5, v4]
    assert versions(api, sid, "b.txt") == [b]

    # A collected version is answered 410 "collected" (diff and restore), not served or guessed.
    for r in (api.http.get(f"/v1/sessions/{sid}/versions/{v2}/diff"),
              api.http.post(f"/v1/sessions/{sid}/versions/{v3}/restore")):
        assert r.status_code == 410 and r.json()["error"] == "collected", r.text
        assert "keep_days" in r.json()["detail"]
    assert (ws / "a.txt").read_text() == "five\n"
    # An id that never was a version here is still a plain 404.
    r = api.http.post(f"/v1/sessions/{sid}/versions/v_zzzzzzzzz000000000000/restore")
    assert r.status_code == 404 and r.json()["error"] == "not_found", r.text

    # Undo walks back through the kept writes, then stops at the collected one instead of jumping
    # over it to b.txt's (older, still kept) write.
    assert api.http.post(f"/v1/sessions/{sid}/undo").status_code == 200
    assert (ws / "a.txt").read_text() == "four\n"
    assert api.http.post(f"/v1/sessions/{sid}/undo").status_code == 200
    assert (ws / "a.txt").read_text() == "orig\n", "v4's content comes from the object v1 shared"
    assert api.http.get(f"/v1/sessions/{sid}/undo").json()["files"] == []
    r = api.http.post(f"/v1/sessions/{sid}/undo")
    assert r.status_code == 404 and "collected" in r.json()["detail"], r.text
    assert (ws / "b.txt").read_text() == "b1\n"

    # Kept versions restore by id as before.
    r = api.http.post(f"/v1/sessions/{sid}/versions/{b}/restore")
    assert r.status_code == 200, r.text
    assert (ws / "b.txt").read_text() == "b0\n"
    d = api.http.get(f"/v1/sessions/{sid}/versions/{v5}/diff")
    assert d.status_code == 200 and "+orig" in d.json()["diff"] and "-four" in d.json()["diff"]

    # The two undos kept a.txt's content first (two young versions): v4 is now third newest and
    # 12 days old, so the next collection takes it (and "orig\n", which no kept version names).
    assert versions(api, sid, "a.txt")[2:] == [v5, v4]
    again = collect(stack, ws)
    assert (again["versions_removed"], again["objects_removed"]) == (1, 1), again
    assert versions(api, sid, "a.txt")[2:] == [v5] and sha("orig\n") not in objects(ws)
    r = api.http.post(f"/v1/sessions/{sid}/versions/{v4}/restore")
    assert r.status_code == 410 and r.json()["error"] == "collected", r.text
    last = collect(stack, ws)
    assert (last["versions_removed"], last["objects_removed"]) == (0, 0), "nothing more to do"


def test_versions_inside_either_rule_are_never_collected(stack: Stack, api: Api, tmp_path: Path) -> None:
    """The stack's policy is 10 days / 2 per file: five young versions of one file all stay.
    Collected here by ``cox gc``, as an operator would."""
    s = api.create("r-young")
    sid, ws = s["id"], Path(s["workspace"])
    evs = run_turn(api, sid, script({"tools": [write("c.txt", str(i)) for i in range(5)]}, {"text": "ok"}))
    ids = [e["version_id"] for e in evs if e["type"] == "version.kept"]
    creds = tmp_path / "credentials.json"
    stack.credentials.save(creds)
    out = subprocess.run([sys.executable, "-m", "cox", "gc", "--workspace", str(ws), "--nats", stack.nats.url,
                          "--credentials", str(creds)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert (res["workspaces"], res["versions_kept"], res["versions_removed"]) == (1, 5, 0), res
    assert versions(api, sid, "c.txt") == ids[::-1]


def test_the_shadow_is_pruned_and_commands_are_still_versioned(stack: Stack, api: Api) -> None:
    s1, s2 = api.create("r-shadow"), api.create("r-shadow")
    ws = Path(s1["workspace"])
    shadow = ws / ".coxswain" / "shadow"
    (ws / "f.txt").write_text("f0\n")
    for i in range(3):
        run_turn(api, s1["id"], script({"tools": [cmd(f"echo f{i + 1} > f.txt; echo {i} > g{i}.txt")]},
                                       {"text": "ok"}))
    run_turn(api, s2["id"], script({"tools": [cmd("echo s2 > h.txt")]}, {"text": "ok"}))
    loose = sum(1 for _ in (shadow / "objects").glob("??/*"))
    assert (shadow / "refs" / "cox" / s1["id"]).is_file() and (shadow / f"index-{s2['id']}").is_file()
    # s2 has been idle for longer than keep_days: its index (the stat cache) goes with its ref.
    old = time.time() - 11 * DAY
    for f in (shadow / f"index-{s2['id']}", shadow / "refs" / "cox" / s2["id"]):
        os.utime(f, (old, old))
    os.utime(shadow / f"index-{s1['id']}", (old, old))  # unchanged files: git may not rewrite an index

    res = collect(stack, ws)
    assert res["shadow_indexes_removed"] == 1, res
    assert not (shadow / f"index-{s2['id']}").exists() and not (shadow / "refs" / "cox" / s2["id"]).exists()
    assert (shadow / f"index-{s1['id']}").is_file(), "an active session keeps its stat cache"
    assert 0 < res["shadow_objects_removed"] < loose, res  # the older snapshots' blobs went; f3's stays

    # The active session's next command still finds the "before" content in the shadow: versioned
    # and undone; the idle one's next snapshot starts afresh, and is versioned too.
    run_turn(api, s1["id"], script({"tools": [cmd("echo f4 > f.txt")]}, {"text": "ok"}))
    run_turn(api, s2["id"], script({"tools": [cmd("echo s2b > h.txt")]}, {"text": "ok"}))
    for sid, path, before in ((s1["id"], "f.txt", "f3\n"), (s2["id"], "h.txt", "s2\n")):
        r = api.http.post(f"/v1/sessions/{sid}/undo")
        assert r.status_code == 200, r.text
        assert (ws / path).read_text() == before


def test_collecting_every_workspace_goes_on_past_a_tampered_one(stack: Stack, api: Api, tmp_path: Path) -> None:
    bad, good = api.create("r-tampered"), api.create("r-fine")
    for s in (bad, good):
        run_turn(api, s["id"], script({"tools": [write("x.txt", "x")]}, {"text": "ok"}))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "objects").mkdir(parents=True)
    (elsewhere / "objects" / "keep.txt").write_text("not the store's\n")
    (Path(bad["workspace"]) / ".coxswain" / "shadow").symlink_to(elsewhere)  # planted by a command

    res = collect(stack)
    assert [f.split(":")[0] for f in res["failed"]] == ["r-tampered"], res
    assert res["workspaces"] >= 2, "every other workspace under the root was collected"
    assert (elsewhere / "objects" / "keep.txt").read_text() == "not the store's\n", "the link was not followed"
