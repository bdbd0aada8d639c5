"""Roles and sharing (docs/api.md, "Roles and sharing"): ``[auth] roles`` (reader, member, admin)
and per-session shares (reader, approver).

The attacks first: a reader's every write call is 403 (and nothing changes), an approver cannot
send or share, a principal nothing is shared with still sees none of it (404, not listed), and a
share taken back takes effect at once: its open event stream closes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.checks import finished, last_seq, one
from tests.support.stack import OTHER_TOKEN, Api, Stack, script, stack_fixture

READER, APPROVER, ADMIN = "tok-reader", "tok-approver", "tok-admin"

stack = stack_fixture(
    "sharing", runners=1, config='[approval]\ncommands = "ask"\n',
    tokens={READER: "rita", APPROVER: "april", ADMIN: "ada"},
    auth='roles = { rita = "reader", ada = "admin" }',
)


def gated(path: str) -> str:
    return script({"tools": [{"name": "run_command", "args": {"command": f"touch {path}"}}]}, {"text": "Done."})


def share(api: Api, sid: str, principal: str, role: str) -> httpx.Response:
    return api.http.post(f"/v1/sessions/{sid}/shares", json={"principal": principal, "role": role})


WRITES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("post", "/messages", {"text": "x"}),
    ("post", "/lead", {"text": "x"}),
    ("patch", "", {"title": "mine now"}),
    ("post", "/compact", None),
    ("post", "/fork", {"at_turn": 1}),
    ("post", "/rewind", {"to_turn": 1, "scope": "conversation"}),
    ("post", "/undo", None),
    ("post", "/observe", {"command": "true"}),
    ("put", "/queue/order", {"message_ids": []}),
    ("delete", "/queue/m_00000000000000000000", None),
    ("post", "/check", {"command": "true"}),
    ("post", "/shares", {"principal": "rita", "role": "approver"}),
    ("delete", "/shares/rita", None),
]


def call(c: Api, method: str, url: str, body: dict[str, Any] | None) -> httpx.Response:
    return c.http.request(method, url, json=body) if body is not None else c.http.request(method, url)


def test_a_reader_sees_a_shared_session_and_every_write_is_403(stack: Stack, api: Api) -> None:
    s = api.create("share-read")
    sid = s["id"]
    api.send(sid, script({"tools": [{"name": "write_file", "args": {"path": "a.txt", "content": "A"}}]}, {"text": "ok"}))
    finished(api, sid)
    with stack.client(READER) as rita, stack.client(OTHER_TOKEN) as other:
        assert rita.http.get(f"/v1/sessions/{sid}").status_code == 404, "nothing is shared yet"
        r = share(api, sid, "rita", "reader")
        assert r.status_code == 200, r.text
        assert r.json()["shares"] == [{"principal": "rita", "role": "reader"}]
        seen = rita.http.get(f"/v1/sessions/{sid}")
        assert seen.status_code == 200 and seen.json()["access"] == "reader"
        assert [x["id"] for x in rita.http.get("/v1/sessions").json()] == [sid], "listed, marked by access"
        assert rita.all_events(sid)[-1]["type"] == "session.shared"
        assert rita.http.get(f"/v1/sessions/{sid}/changes").status_code == 200
        version = one(api.all_events(sid), "file.written")
        assert rita.http.get(f"/v1/sessions/{sid}/versions", params={"path": "a.txt"}).status_code == 200, version
        before = last_seq(api, sid)
        for method, path, body in WRITES:
            got = call(rita, method, f"/v1/sessions/{sid}{path}", body)
            assert got.status_code == 403, (method, path, got.status_code, got.text)
            assert got.json()["error"] == "forbidden"
            assert call(other, method, f"/v1/sessions/{sid}{path}", body).status_code == 404, "not shared: none"
        assert rita.http.post("/v1/sessions", json={"workspace": "rita-ws"}).status_code == 403
        assert rita.http.post("/v1/runs", json={"workspace": "rita-ws", "text": "x"}).status_code == 403
        up = rita.http.post(f"/v1/sessions/{sid}/attachments", files={"file": ("n.txt", b"hi", "text/plain")})
        assert up.status_code == 403
        time.sleep(0.3)
        assert last_seq(api, sid) == before, "no write of the reader's changed anything"
        blobs = Path(stack.root) / ".coxswain" / "attachments"
        kept = [p for p in blobs.iterdir() if p.is_file()] if blobs.is_dir() else []
        assert not kept, f"the reader's upload kept no bytes: {kept}"
        assert other.http.get(f"/v1/sessions/{sid}").status_code == 404
        assert sid not in [x["id"] for x in other.http.get("/v1/sessions").json()]


def test_an_approver_answers_and_stops_but_cannot_send_or_share(stack: Stack, api: Api) -> None:
    s = api.create("share-approve")
    sid = s["id"]
    assert share(api, sid, "april", "approver").status_code == 200
    with stack.client(APPROVER) as april:
        assert april.http.post(f"/v1/sessions/{sid}/messages", json={"text": "x"}).status_code == 403
        assert share(april, sid, "april", "reader").status_code == 403, "only the owner or an admin shares"
        api.send(sid, gated("ok.txt"))
        pending = api.wait_type(sid, "approval.pending")
        r = april.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
        assert r.status_code == 200, r.text
        _, evs = finished(api, sid)
        assert one(evs, "approval.resolved")["decision"] == "allow"
        assert (Path(s["workspace"]) / "ok.txt").exists()
        after = last_seq(api, sid)
        api.send(sid, script({"tools": [{"name": "run_command", "args": {"command": "sleep 20"}}]}))
        api.wait_type(sid, "tool.call", after=after)
        stop = april.http.post(f"/v1/sessions/{sid}/stop")
        assert stop.status_code == 200, stop.text
        end, _ = finished(api, sid, after=after)
        assert end["outcome"] == "stopped"


def test_unsharing_takes_effect_at_once_and_closes_the_open_stream(stack: Stack, api: Api) -> None:
    s = api.create("share-revoke")
    sid = s["id"]
    assert share(api, sid, "rita", "reader").status_code == 200
    got: list[str] = []
    closed = threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {READER}"}, timeout=60) as c, \
                c.stream("GET", f"/v1/sessions/{sid}/events") as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("event: "):
                    got.append(line.removeprefix("event: "))
        closed.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while "session.shared" not in got:
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    r = api.http.delete(f"/v1/sessions/{sid}/shares/rita")
    assert r.status_code == 200 and r.json()["shares"] == []
    assert closed.wait(10), "the stream closed at the unshare"
    assert got[-1] == "session.unshared"
    with stack.client(READER) as rita:
        assert rita.http.get(f"/v1/sessions/{sid}").status_code == 404
        assert rita.http.get(f"/v1/sessions/{sid}/events", params={"format": "json"}).status_code == 404
        assert sid not in [x["id"] for x in rita.http.get("/v1/sessions").json()]
    assert api.http.delete(f"/v1/sessions/{sid}/shares/rita").status_code == 404, "not shared any more"
    evs = api.all_events(sid)
    assert [e["type"] for e in evs if e["type"].startswith("session.")][-2:] == ["session.shared", "session.unshared"]


def test_an_admin_sees_and_acts_on_any_session_and_shares_it(stack: Stack, api: Api) -> None:
    with stack.client(OTHER_TOKEN) as other, stack.client(ADMIN) as ada:
        s = other.create("share-admin")
        sid = s["id"]
        seen = ada.http.get(f"/v1/sessions/{sid}")
        assert seen.status_code == 200 and seen.json()["access"] == "admin"
        assert ada.http.patch(f"/v1/sessions/{sid}", json={"title": "by the admin"}).status_code == 200
        assert other.session(sid)["title"] == "by the admin"
        assert share(ada, sid, "rita", "reader").status_code == 200
        shared = [e for e in other.all_events(sid) if e["type"] == "session.shared"]
        assert shared and shared[-1]["principal"] == "rita"
        assert api.http.get(f"/v1/sessions/{sid}").status_code == 404, "a member sees only its own and shared"
