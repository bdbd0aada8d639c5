"""Attachments on sends, on a real stack (docs/api.md, "POST /v1/sessions/{sid}/attachments"): an
image reaches a vision model as an image part (read off the fake provider's wire, OpenAI and
Anthropic), a model without vision refuses it before any turn, a text file reaches the model as
text and another file is put in the workspace and named, an upload over the limit is 413 with
nothing kept, a type not allowed is 415, a Lead with one is 409 ``lead_text_only``, a queued
message keeps its attachments, and a fork keeps them (readable again from the fork)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coxswain import keys
from tests.support.checks import finished, last_seq, of_type
from tests.support.fake_providers import FakeModels
from tests.support.stack import Api, Stack, running, said

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
NOTES = "attached notes: the build needs make 4.3\n"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake: FakeModels) -> Iterator[Stack]:
    config = f"""
[model]
default = "script"

[attachments]
max_mb = 20
collect_every_s = 0.5
allowed_types = ["image/*", "text/*", "application/pdf"]

[[model.providers]]
name = "fake-vision"
kind = "openai"
base_url = "{fake.url}/v1"
model = "fake-vision-model"
api_key = "sk-test-not-a-key"
vision = true

[[model.providers]]
name = "fake-text-only"
kind = "openai"
base_url = "{fake.url}/v1"
model = "fake-text-model"
api_key = "sk-test-not-a-key"

[[model.providers]]
name = "fake-claude"
kind = "anthropic"
base_url = "{fake.url}"
model = "claude-fake-1"
api_key = "sk-ant-test-not-a-key"
max_tokens = 256
"""
    with running(tmp_path_factory.mktemp("attachments"), runners=1, config=config) as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as a:
        yield a


@pytest.fixture(autouse=True)
def vision_back(fake: FakeModels) -> Iterator[None]:
    yield
    fake.vision = True


def upload(api: Api, sid: str, name: str, data: bytes, media_type: str) -> dict[str, Any]:
    r = api.http.post(f"/v1/sessions/{sid}/attachments", files={"file": (name, data, media_type)})
    assert r.status_code == 201, r.text
    out = dict(r.json())
    assert set(out) == {"attachment_id", "name", "media_type", "size"}
    assert out["name"] == name and out["media_type"] == media_type and out["size"] == len(data)
    return out


def turn(api: Api, sid: str, text: str, ids: list[str]) -> list[dict[str, Any]]:
    after = last_seq(api, sid)
    r = api.send(sid, text, attachments=ids)
    assert r.status_code == 202, r.text
    end, evs = finished(api, sid, after=after)
    assert end["outcome"] == "completed", end
    return evs


def user_msg(evs: list[dict[str, Any]], text: str) -> dict[str, Any]:
    found = [e for e in of_type(evs, "user.msg") if e["text"].startswith(text)]
    assert len(found) == 1, found
    return found[0]


def last_user_content(request: dict[str, Any]) -> Any:
    return [m for m in request["messages"] if m.get("role") == "user"][-1]["content"]


def blobs(stack: Stack) -> set[str]:
    folder = stack.root / ".coxswain" / "attachments"
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


# ------------------------------------------------------------------ images


@pytest.mark.parametrize(("model", "kind"), [("fake-vision", "openai"), ("fake-claude", "anthropic")])
def test_an_image_reaches_a_vision_model_as_an_image_part_on_the_wire(api: Api, fake: FakeModels, model: str,
                                                                      kind: str) -> None:
    sid = api.create(f"att-img-{kind}", model=model)["id"]
    a = upload(api, sid, "screen.png", PNG, "image/png")
    case = f"img-{kind}"
    evs = turn(api, sid, f"[case:{case}] what is in the picture", [a["attachment_id"]])

    # the wire: the request of this case carries the image, bytes intact
    assert fake.for_case(case, kind), "the model got no request"
    assert fake.images(case)[:1] == [("image/png", PNG)]
    # the log: user.msg carries the attachment's record
    msg = user_msg(evs, f"[case:{case}]")
    assert msg["attachments"] == [{"attachment_id": a["attachment_id"], "name": "screen.png",
                                   "media_type": "image/png", "size": len(PNG),
                                   "sha256": hashlib.sha256(PNG).hexdigest()}]
    # readable again, with its type, name and digest
    r = api.http.get(f"/v1/sessions/{sid}/attachments/{a['attachment_id']}")
    assert r.status_code == 200 and r.content == PNG
    assert r.headers["content-type"] == "image/png"
    assert r.headers["x-cox-sha256"] == hashlib.sha256(PNG).hexdigest()
    assert "screen.png" in r.headers["content-disposition"]


def test_a_model_without_vision_refuses_an_image_before_the_turn(api: Api, fake: FakeModels) -> None:
    fake.vision = False  # were it sent, the text-only server would refuse it (and the test would see it)
    sid = api.create("att-no-vision", model="fake-text-only")["id"]
    a = upload(api, sid, "screen.png", PNG, "image/png")
    before = last_seq(api, sid)
    requests = len(fake.requests)
    r = api.send(sid, "[case:novision] look at this", attachments=[a["attachment_id"]])
    assert r.status_code == 409, r.text
    assert r.json()["error"] == "not_accepting"
    detail = r.json()["detail"]
    assert "fake-text-only" in detail and "images" in detail and "screen.png" in detail and "vision" in detail
    s = api.session(sid)
    assert not s["busy"] and s["last_seq"] == before, "nothing recorded, no turn started"
    assert len(fake.requests) == requests and fake.refused == []
    # the same session, switched to a model with vision, takes the image
    fake.vision = True
    assert api.http.patch(f"/v1/sessions/{sid}", json={"model": "fake-vision"}).status_code == 200
    turn(api, sid, "[case:novision-then] now look", [a["attachment_id"]])
    assert fake.images("novision-then")[:1] == [("image/png", PNG)]


# ------------------------------------------------------------------ text and other files


def test_a_text_file_reaches_the_model_as_text_and_another_file_is_put_in_the_workspace(
        api: Api, fake: FakeModels) -> None:
    s = api.create("att-files", model="fake-vision")
    sid, ws = s["id"], Path(s["workspace"])
    t = upload(api, sid, "notes.txt", NOTES.encode(), "text/plain")
    pdf_bytes = b"%PDF-1.4\n% a tiny file\n"
    p = upload(api, sid, "spec sheet.pdf", pdf_bytes, "application/pdf")
    turn(api, sid, "[case:files] read these", [t["attachment_id"], p["attachment_id"]])

    content = json.dumps(last_user_content(fake.for_case("files")[0]))
    assert NOTES.strip() in content, content
    rel = f".coxswain/attachments/{p['attachment_id']}-spec_sheet.pdf"
    assert rel in content, content
    assert (ws / rel).read_bytes() == pdf_bytes
    assert fake.images("files") == []


def test_a_queued_message_keeps_its_attachments(api: Api) -> None:
    sid = api.create("att-queue")["id"]
    t = upload(api, sid, "queued.txt", NOTES.encode(), "text/plain")
    after = last_seq(api, sid)
    assert api.send(sid, said("slow", {"text": "slow", "delay_ms": 1500})).status_code == 202
    r = api.send(sid, said("queued with a file", {"history": True}), mode="queue", attachments=[t["attachment_id"]])
    assert r.status_code == 202 and r.json()["disposition"] == "queued", r.text
    finished(api, sid, after=after)
    api.wait_type(sid, "turn.end", after=api.wait_type(sid, "user.msg", after=after, via="queue")["seq"])
    evs = api.all_events(sid)
    msg = user_msg(evs, "queued with a file")
    assert [x["attachment_id"] for x in msg["attachments"]] == [t["attachment_id"]]
    assert msg["attachments"][0]["sha256"] == hashlib.sha256(NOTES.encode()).hexdigest()


# ------------------------------------------------------------------ refusals


def test_an_attachment_over_the_limit_is_413_and_nothing_is_kept(stack: Stack, api: Api) -> None:
    sid = api.create("att-big")["id"]
    kept, before = blobs(stack), last_seq(api, sid)
    big = b"\0" * (50 * 1024 * 1024)
    r = api.http.post(f"/v1/sessions/{sid}/attachments", files={"file": ("big.bin", big, "application/pdf")})
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "too_large" and str(20 * 1024 * 1024) in r.json()["detail"]
    assert blobs(stack) == kept
    assert stack.redis_client().hlen(keys.session(sid) + keys.ATTACHMENTS) == 0
    assert last_seq(api, sid) == before


def test_a_type_not_allowed_is_415_and_an_unknown_id_404(stack: Stack, api: Api) -> None:
    sid = api.create("att-type")["id"]
    kept = blobs(stack)
    r = api.http.post(f"/v1/sessions/{sid}/attachments", files={"file": ("tool.exe", b"MZ", "application/x-msdownload")})
    assert r.status_code == 415, r.text
    assert r.json()["error"] == "unsupported_media_type" and "application/x-msdownload" in r.json()["detail"]
    assert blobs(stack) == kept
    r = api.send(sid, "with a made-up attachment", attachments=["att_nosuchthing"])
    assert r.status_code == 404 and r.json()["error"] == "not_found", r.text
    assert api.http.get(f"/v1/sessions/{sid}/attachments/att_nosuchthing").status_code == 404
    # another principal's session is 404 for the upload too
    other = api.http.post("/v1/sessions/s_nosuchsession/attachments", files={"file": ("a.txt", b"x", "text/plain")})
    assert other.status_code == 404


def test_a_lead_with_an_attachment_is_409_lead_text_only(api: Api) -> None:
    sid = api.create("att-lead")["id"]
    t = upload(api, sid, "lead.txt", b"for the lead", "text/plain")
    after = last_seq(api, sid)
    assert api.send(sid, said("slow", {"text": "slow", "delay_ms": 3000})).status_code == 202
    api.wait_type(sid, "turn.start", after=after)
    r = api.http.post(f"/v1/sessions/{sid}/lead", json={"text": "use this", "attachments": [t["attachment_id"]]})
    assert r.status_code == 409, r.text
    assert r.json()["error"] == "lead_text_only"
    _, evs = finished(api, sid, after=after)
    assert of_type(evs, "lead.saved") == []


# ------------------------------------------------------------------ fork


def test_a_fork_keeps_the_attachment(api: Api) -> None:
    sid = api.create("att-fork")["id"]
    t = upload(api, sid, "forked.txt", NOTES.encode(), "text/plain")
    turn(api, sid, said("turn one with a file", {"text": "ok"}), [t["attachment_id"]])
    r = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 1})
    assert r.status_code == 201, r.text
    fid = r.json()["id"]
    msg = user_msg(api.all_events(fid), "turn one with a file")
    assert [x["attachment_id"] for x in msg["attachments"]] == [t["attachment_id"]]
    got = api.http.get(f"/v1/sessions/{fid}/attachments/{t['attachment_id']}")
    assert got.status_code == 200 and got.content == NOTES.encode()
    assert got.headers["content-type"].startswith("text/plain")


# ------------------------------------------------------------------ the store folder is no workspace


def test_no_workspace_can_be_or_reach_into_the_store_folder(stack: Stack, api: Api) -> None:
    """The blobs live in ``<root>/.coxswain/attachments``: a session, a run or a run's template on
    ``.coxswain`` itself, a path through it, a spelling that resolves to it, or a link to it is
    refused (422), so no session's commands ever get the blobs as their workspace."""
    sid = api.create("att-store-attack")["id"]
    upload(api, sid, "secret.txt", b"another session's file\n", "text/plain")
    store = stack.root / ".coxswain"
    assert (store / "attachments").is_dir()
    (stack.root / "link-to-store").symlink_to(store, target_is_directory=True)
    (stack.root / "link-to-blobs").symlink_to(store / "attachments", target_is_directory=True)
    names = [".coxswain", ".coxswain/", "./.coxswain", ".coxswain/attachments", ".coxswain/new-folder",
             "x/../.coxswain", "x/../.coxswain/attachments", str(store), str(store / "attachments"),
             "link-to-store", "link-to-store/attachments", "link-to-blobs", "sub/.coxswain"]
    before = {p.name for p in store.iterdir()}
    for name in names:
        for path, body in [("/v1/sessions", {"workspace": name}),
                           ("/v1/runs", {"workspace": name, "text": "x"}),
                           ("/v1/runs", {"template": name, "text": "x"})]:
            r = api.http.post(path, json=body)
            assert r.status_code == 422 and r.json()["error"] in ("workspace_invalid", "invalid"), (path, body, r.text)
    assert {p.name for p in store.iterdir()} == before, "nothing made in the store folder"
    assert not (stack.root / "sub").exists()
    listed = api.http.get("/v1/workspaces")
    assert listed.status_code == 200, listed.text
    assert not any(".coxswain" in str(w) or "link-to-" in str(w) for w in listed.json()["workspaces"]), listed.text


# ------------------------------------------------------------------ JSON with base64


def test_an_upload_as_json_with_base64_is_kept_like_a_multipart_one(stack: Stack, api: Api, fake: FakeModels) -> None:
    sid = api.create("att-json", model="fake-vision")["id"]
    url = f"/v1/sessions/{sid}/attachments"
    r = api.http.post(url, json={"name": "shot.png", "media_type": "image/png", "data": base64.b64encode(PNG).decode()})
    assert r.status_code == 201, r.text
    img = r.json()
    assert (img["name"], img["media_type"], img["size"]) == ("shot.png", "image/png", len(PNG))
    # no media_type: guessed from the name, as for a multipart part without one
    r = api.http.post(url, json={"name": "notes.txt", "data": base64.b64encode(NOTES.encode()).decode()})
    assert r.status_code == 201 and r.json()["media_type"] == "text/plain", r.text
    txt = r.json()
    got = api.http.get(f"{url}/{img['attachment_id']}")
    assert got.status_code == 200 and got.content == PNG
    turn(api, sid, "[case:json-upload] look", [img["attachment_id"], txt["attachment_id"]])
    assert fake.images("json-upload")[:1] == [("image/png", PNG)]
    assert NOTES.strip() in json.dumps(last_user_content(fake.for_case("json-upload")[0]))

    kept, before = blobs(stack), last_seq(api, sid)
    bad: list[tuple[Any, int, str]] = [
        ({"name": "a.txt", "data": "not base64!"}, 422, "invalid"),
        ({"name": "", "data": ""}, 422, "invalid"),
        ({"data": "eA=="}, 422, "invalid"),
        ({"name": "a.txt", "data": "eA==", "extra": 1}, 422, "invalid"),
        ({"name": "tool.exe", "media_type": "application/x-msdownload", "data": "TVo="}, 415,
         "unsupported_media_type"),
        ({"name": "big.pdf", "media_type": "application/pdf",
          "data": base64.b64encode(b"\0" * (20 * 1024 * 1024 + 1)).decode()}, 413, "too_large"),
    ]
    for body, status, code in bad:
        r = api.http.post(url, json=body)
        assert (r.status_code, r.json()["error"]) == (status, code), (str(body)[:80], r.text[:300])
    r = api.http.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["error"]) == (400, "bad_json"), r.text
    r = api.http.post(url, content=b"x", headers={"content-type": "text/plain"})
    assert (r.status_code, r.json()["error"]) == (422, "invalid"), r.text
    assert blobs(stack) == kept and last_seq(api, sid) == before, "nothing kept or recorded"


# ------------------------------------------------------------------ rewind


def test_a_rewind_before_the_message_drops_the_attachment_from_the_conversation_and_keeps_the_file(
        stack: Stack, api: Api, fake: FakeModels) -> None:
    sid = api.create("att-rewind", model="fake-vision")["id"]
    secret_notes = "rewound notes: the port is 4242\n"
    turn(api, sid, "[case:rw-1] first", [])
    t = upload(api, sid, "rewound.txt", secret_notes.encode(), "text/plain")
    i = upload(api, sid, "rewound.png", PNG, "image/png")
    turn(api, sid, "[case:rw-2] with files", [t["attachment_id"], i["attachment_id"]])
    assert "4242" in json.dumps(fake.for_case("rw-2")[0]["messages"]) and fake.images("rw-2")

    r = api.http.post(f"/v1/sessions/{sid}/rewind", json={"to_turn": 1, "scope": "conversation"})
    assert r.status_code == 200, r.text
    turn(api, sid, "[case:rw-3] after the rewind", [])
    sent = json.dumps(fake.for_case("rw-3")[0]["messages"])
    assert "rw-1" in sent, "the kept turn is in the conversation"
    assert "4242" not in sent and "rw-2" not in sent and fake.images("rw-3") == [], \
        "the rewound message and its attachments are not"
    # the log keeps the message, so its files stay readable and kept (docs/api.md)
    for a, data in ((t, secret_notes.encode()), (i, PNG)):
        got = api.http.get(f"/v1/sessions/{sid}/attachments/{a['attachment_id']}")
        assert got.status_code == 200 and got.content == data
        assert hashlib.sha256(data).hexdigest() in blobs(stack)
    # and a rewind to the turn that carried them gives them back to the model
    r = api.http.post(f"/v1/sessions/{sid}/rewind", json={"to_turn": 2, "scope": "conversation"})
    assert r.status_code == 200, r.text
    turn(api, sid, "[case:rw-4] back again", [])
    assert "4242" in json.dumps(fake.for_case("rw-4")[0]["messages"]) and fake.images("rw-4")[:1] == [
        ("image/png", PNG)]


# ------------------------------------------------------------------ credentials


AWS = "deploy notes\nAWS_ACCESS_KEY_ID = 'AKIAIOSFODNN7EXAMPLE'\nregion = 'eu-west-1'\n"


@pytest.mark.parametrize("decision", ["deny", "allow"])
def test_an_attachment_that_looks_like_a_credential_asks_the_person_before_the_model_gets_it(
        api: Api, fake: FakeModels, decision: str) -> None:
    sid = api.create(f"att-cred-{decision}", model="fake-vision")["id"]
    a = upload(api, sid, "creds.txt", AWS.encode(), "text/plain")
    case = f"cred-{decision}"
    after = last_seq(api, sid)
    assert api.send(sid, f"[case:{case}] deploy with these", attachments=[a["attachment_id"]]).status_code == 202
    pending = api.wait_type(sid, "approval.pending", after=after)
    assert pending["security"] is True and pending["name"] == "attachment", pending
    assert pending["args"]["attachment_id"] == a["attachment_id"] and pending["args"]["name"] == "creds.txt"
    assert "credential" in pending["reason"] and "AWS" in pending["reason"], pending
    assert "AKIA" not in json.dumps(pending), "the question names the file, never its content"
    assert fake.for_case(case) == [], "the model gets nothing while the person is asked"
    r = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": decision})
    assert r.status_code == 200, r.text
    end, evs = finished(api, sid, after=after)
    assert end["outcome"] == "completed", end
    sent = json.dumps(fake.for_case(case)[0]["messages"])
    withheld = of_type(evs, "attachment.withheld")
    if decision == "deny":
        assert "AKIA" not in sent and "creds.txt" in sent and "withheld" in sent, sent
        assert [(w["attachment_id"], w["name"]) for w in withheld] == [(a["attachment_id"], "creds.txt")]
        # a later turn's transcript, rebuilt from the log, still leaves it out
        turn(api, sid, f"[case:{case}-later] and now?", [])
        assert "AKIA" not in json.dumps(fake.for_case(f"{case}-later")[0]["messages"])
    else:
        assert "AKIAIOSFODNN7EXAMPLE" in sent and withheld == []
    # either way the message keeps it: readable again
    got = api.http.get(f"/v1/sessions/{sid}/attachments/{a['attachment_id']}")
    assert got.status_code == 200 and got.content == AWS.encode()


def test_a_clean_text_attachment_asks_nobody(api: Api, fake: FakeModels) -> None:
    sid = api.create("att-clean", model="fake-vision")["id"]
    a = upload(api, sid, "plain.txt", NOTES.encode(), "text/plain")
    evs = turn(api, sid, "[case:clean] read", [a["attachment_id"]])
    assert of_type(evs, "approval.pending") == [] and of_type(evs, "attachment.withheld") == []
    assert NOTES.strip() in json.dumps(fake.for_case("clean")[0]["messages"])


# ------------------------------------------------------------------ collecting unnamed uploads


def test_an_upload_no_message_named_is_removed_after_ttl_and_a_named_one_is_kept(stack: Stack, api: Api) -> None:
    """Blobs are aged by their mtime (their latest upload): one no message named and older than
    ``ttl_s`` + the grace is removed by the runner's collector; one a message named stays, as does
    a fresh one; a crashed upload's old temporary goes too."""
    sid = api.create("att-collect")["id"]
    unnamed = upload(api, sid, "unnamed.txt", b"nobody sends this\n", "text/plain")
    named = upload(api, sid, "named.txt", b"this one is sent\n", "text/plain")
    fresh = upload(api, sid, "fresh.txt", b"uploaded just now\n", "text/plain")
    turn(api, sid, said("send one", {"text": "ok"}), [named["attachment_id"]])
    folder = stack.root / ".coxswain" / "attachments"
    sha = {k: hashlib.sha256(v).hexdigest() for k, v in (("unnamed", b"nobody sends this\n"),
                                                          ("named", b"this one is sent\n"),
                                                          ("fresh", b"uploaded just now\n"))}
    assert (folder / "kept" / sha["named"]).exists() and not (folder / "kept" / sha["unnamed"]).exists()
    old = time.time() - 86_400 - 3600
    for k in ("unnamed", "named"):
        os.utime(folder / sha[k], (old, old))
    crashed = folder / ".up-crashed"
    crashed.write_bytes(b"half an upload")
    os.utime(crashed, (old, old))
    deadline = time.monotonic() + 20
    while (folder / sha["unnamed"]).exists() or crashed.exists():
        assert time.monotonic() < deadline, "the collector did not remove the old unnamed blob"
        time.sleep(0.2)
    assert (folder / sha["named"]).exists() and (folder / sha["fresh"]).exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(".gc-")], "nothing left aside"
    got = api.http.get(f"/v1/sessions/{sid}/attachments/{named['attachment_id']}")
    assert got.status_code == 200 and got.content == b"this one is sent\n"
    gone = api.http.get(f"/v1/sessions/{sid}/attachments/{unnamed['attachment_id']}")
    assert gone.status_code == 404 and "no longer kept" in gone.json()["detail"], gone.text
    assert api.http.get(f"/v1/sessions/{sid}/attachments/{fresh['attachment_id']}").status_code == 200


# ------------------------------------------------------------------ the model changed while it waited


def test_a_queued_image_whose_session_moved_to_a_model_without_vision_is_refused_when_it_starts(
        api: Api, fake: FakeModels) -> None:
    """Queued while the session's model took images, started after it was switched to one that
    does not: the turn is refused before the model is asked (a clear ``turn.end``), the message
    keeps its attachment, the queue goes on, a later turn on that model is not sent the image,
    and back on a model with vision the same attachment is sent again."""
    fake.vision = False  # were the image sent, the text-only server would refuse it (fake.refused)
    sid = api.create("att-switch")["id"]  # the script model: it takes images
    img = upload(api, sid, "queued.png", PNG, "image/png")
    after = last_seq(api, sid)
    assert api.send(sid, said("slow", {"text": "slow", "delay_ms": 1500})).status_code == 202
    api.wait_type(sid, "turn.start", after=after)
    r = api.send(sid, "[case:switched] look at this", mode="queue", attachments=[img["attachment_id"]])
    assert r.status_code == 202 and r.json()["disposition"] == "queued", r.text
    r = api.send(sid, "[case:switched-next] and this after", mode="queue")
    assert r.status_code == 202, r.text
    assert api.http.patch(f"/v1/sessions/{sid}", json={"model": "fake-text-only"}).status_code == 200
    msg = api.wait_type(sid, "user.msg", after=after, via="queue", timeout=30)
    end = api.wait_type(sid, "turn.end", after=msg["seq"], timeout=30)
    assert end["outcome"] == "error", end
    for word in ("not_accepting", "fake-text-only", "images", "queued.png", "kept"):
        assert word in end["detail"], end
    assert fake.for_case("switched") == [] and fake.refused == [], "nothing went to the model"
    assert [a["attachment_id"] for a in msg["attachments"]] == [img["attachment_id"]], "the message keeps it"
    # the queue goes on: the next message runs on the new model, which is told of the image, not sent it
    nxt = api.wait_type(sid, "user.msg", after=end["seq"], via="queue", timeout=30)
    nend = api.wait_type(sid, "turn.end", after=nxt["seq"], timeout=30)
    assert nend["outcome"] == "completed", nend
    assert fake.refused == [] and fake.images("switched-next") == []
    assert "queued.png" in json.dumps(fake.for_case("switched-next")[0]["messages"])
    got = api.http.get(f"/v1/sessions/{sid}/attachments/{img['attachment_id']}")
    assert got.status_code == 200 and got.content == PNG
    # back on a model that takes images, the same attachment goes with a send again
    fake.vision = True
    api.wait_idle(sid)
    assert api.http.patch(f"/v1/sessions/{sid}", json={"model": "fake-vision"}).status_code == 200
    turn(api, sid, "[case:switched-back] now look", [img["attachment_id"]])
    assert fake.images("switched-back")[:1] == [("image/png", PNG)]
