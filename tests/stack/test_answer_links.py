"""Answer links (docs/api.md, "Answer links"): each ``approval.pending`` carries ``answer_url``, a
signed, single-use, expiring link that answers that approval from a client with no token.

The attacks come first: a forged or tampered link, another approval's id under a valid MAC's
shape, a decision the link does not give, a second use, an expired link; each changes nothing."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.checks import finished, last_seq, of_type, one
from tests.support.stack import Api, Stack, script, stack_fixture

LINK_TTL_S = 4

stack = stack_fixture("answer-links", runners=1,
                      config=f'[approval]\ncommands = "ask"\nlink_ttl_s = {LINK_TTL_S}\n')


def touch(path: str) -> str:
    return script({"tools": [{"name": "run_command", "args": {"command": f"touch {path}"}}]}, {"text": "Went on."})


def anonymous(stack: Stack) -> httpx.Client:
    """A client with no bearer token, as a phone opening the link would be."""
    return httpx.Client(base_url=stack.url, timeout=30, follow_redirects=False)


def pending_link(api: Api, sid: str, after: int) -> dict[str, Any]:
    pending = api.wait_type(sid, "approval.pending", after=after)
    assert pending["answer_url"].startswith("/answer/"), pending
    return pending


def test_a_link_answers_from_a_client_with_no_token_once(stack: Stack, api: Api) -> None:
    s = api.create("link-once")
    sid = s["id"]
    api.send(sid, touch("made.txt"))
    pending = pending_link(api, sid, 0)
    url = pending["answer_url"]
    listed = api.session(sid)["approvals"]
    assert [a["answer_url"] for a in listed] == [url], "the session object's pending approval carries it"
    with anonymous(stack) as phone:
        page = phone.get(url)
        assert page.status_code == 200, page.text
        assert "touch made.txt" in page.text and 'value="allow"' in page.text and 'value="deny"' in page.text
        assert page.headers["referrer-policy"] == "no-referrer" and page.headers["cache-control"] == "no-store"
        r = phone.post(url, data={"decision": "allow", "message": "go ahead from my phone"})
        assert r.status_code == 200, r.text
        end, evs = finished(api, sid)
        assert end["outcome"] == "completed"
        resolved = one(evs, "approval.resolved")
        assert (resolved["decision"], resolved["actor"], resolved["message"]) == ("allow", "person", "go ahead from my phone")
        assert (Path(s["workspace"]) / "made.txt").exists()
        again = phone.post(url, data={"decision": "deny"})
        assert again.status_code == 410, "single use"
        assert phone.get(url).status_code == 410
        assert phone.post(url, json={"decision": "deny"}).json()["error"] == "gone"
    assert len(of_type(api.all_events(sid), "approval.resolved")) == 1, "the second use changed nothing"


def test_forged_tampered_and_foreign_links_answer_nothing(stack: Stack, api: Api) -> None:
    s = api.create("link-forged")
    sid = s["id"]
    after = last_seq(api, sid)
    api.send(sid, touch("never.txt"))
    pending = pending_link(api, sid, after)
    token = pending["answer_url"].removeprefix("/answer/")
    sid_, aid, exp, decisions, mac = token.split(".")
    other = api.create("link-other")["id"]
    forged = [
        f"{sid_}.{aid}.{exp}.{decisions}.{'A' * len(mac)}",           # a MAC guessed
        f"{sid_}.{aid}.{int(exp) + 3_600_000}.{decisions}.{mac}",     # the expiry pushed on
        f"{other}.{aid}.{exp}.{decisions}.{mac}",                     # another session
        f"{sid_}.a_0000000000000000000000.{exp}.{decisions}.{mac}",   # another approval
        f"{sid_}.{aid}.{exp}.a.{mac}",                                # the decision set narrowed
        f"{sid_}.{aid}.{exp}",                                        # cut short
        "..../etc/passwd",
    ]
    with anonymous(stack) as phone:
        for bad in forged:
            got = phone.post("/answer/" + bad, data={"decision": "allow"})
            assert got.status_code == 404, (bad, got.status_code, got.text)
            assert phone.get("/answer/" + bad).status_code == 404
        refused = phone.post(pending["answer_url"], data={"decision": "maybe"})
        assert refused.status_code == 400
        assert phone.post(pending["answer_url"], json=["allow"]).status_code == 400
    time.sleep(0.5)
    assert not of_type(api.all_events(sid), "approval.resolved"), "nothing was answered"
    assert not (Path(s["workspace"]) / "never.txt").exists()
    assert api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "deny"}).status_code == 200
    finished(api, sid, after=after)


def test_an_expired_link_is_410_and_changes_nothing(stack: Stack, api: Api) -> None:
    s = api.create("link-expired")
    sid = s["id"]
    after = last_seq(api, sid)
    api.send(sid, touch("late.txt"))
    pending = pending_link(api, sid, after)
    exp_ms = int(pending["answer_url"].split(".")[2])
    assert abs(exp_ms - pending["ts"] - LINK_TTL_S * 1000) < 2000, "it expires link_ttl_s after the approval opened"
    time.sleep(max(0.0, exp_ms / 1000 - time.time()) + 0.3)
    with anonymous(stack) as phone:
        assert phone.get(pending["answer_url"]).status_code == 410
        assert phone.post(pending["answer_url"], data={"decision": "allow"}).status_code == 410
    assert not [e for e in of_type(api.all_events(sid), "approval.resolved") if e["seq"] > after]
    assert api.session(sid)["approvals"][0]["approval_id"] == pending["approval_id"], "still open for the console"
    api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "deny"})
    finished(api, sid, after=after)


def test_the_page_escapes_what_the_model_wrote(stack: Stack, api: Api) -> None:
    s = api.create("link-xss")
    sid = s["id"]
    after = last_seq(api, sid)
    evil = "touch '<script>alert(1)</script>'"
    api.send(sid, script({"tools": [{"name": "run_command", "args": {"command": evil}}]}, {"text": "x"}))
    pending = pending_link(api, sid, after)
    with anonymous(stack) as phone:
        page = phone.get(pending["answer_url"])
    assert "<script>" not in page.text and html.escape(evil) in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "deny"})
    finished(api, sid, after=after)
