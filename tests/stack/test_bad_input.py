"""Bad input over HTTP gets a clear error and changes nothing: ids that could reach a NATS
subject, bodies too large, invalid UTF-8, lone surrogates, and sends a session cannot accept
(``409 not_accepting``: no model chosen, a model that is not configured)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.logcheck import log_of, replay
from tests.support.runners import respawn
from tests.support.stack import Api, Stack, stack_fixture

# Sessions get no model unless one is named; "gone" is configured now and removed later.
CONFIG = """
[model]
default = ""

[[model.providers]]
name = "gone"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "nothing"
"""
MAX_BODY = 1_048_576


stack = stack_fixture("badin", runners=2, config=CONFIG)


@pytest.fixture(scope="module")
def sid(stack: Stack) -> str:
    with stack.client() as api:
        return str(api.create("bad-input", model="script")["id"])


def error(r: Any, status: int, code: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error", "detail"} and body["error"] == code and body["detail"], body
    return str(body["detail"])


@pytest.mark.parametrize("bad", ["a.b", "a*", "a>", ">", "a b", "x" * 65, "s_1.>", "%2A"])
def test_session_ids_that_could_reach_a_subject_are_refused(api: Api, bad: str) -> None:
    from urllib.parse import quote

    path = quote(bad, safe="")
    for method, suffix, body in (("GET", "", None), ("POST", "/messages", {"text": "hi"}), ("POST", "/stop", None),
                                 ("GET", "/events?format=json", None), ("POST", "/lead", {"text": "x"})):
        r = api.http.request(method, f"/v1/sessions/{path}{suffix}", json=body)
        error(r, 422, "invalid")


def test_other_ids_in_paths_and_bodies_are_checked(api: Api, sid: str) -> None:
    error(api.http.post(f"/v1/sessions/{sid}/approvals/a.b", json={"decision": "allow"}), 422, "invalid")
    error(api.send(sid, "hi", client_id="c.1"), 422, "invalid")
    error(api.send(sid, "hi", client_id="c>"), 422, "invalid")
    error(api.send("s_doesnotexist", "hi"), 404, "not_found")


def test_a_body_over_the_limit_is_413(api: Api, sid: str) -> None:
    big = "x" * (MAX_BODY + 10)
    detail = error(api.send(sid, big), 413, "too_large")
    assert str(MAX_BODY) in detail

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds for a streamed body too
        yield b'{"text": "'
        for _ in range(MAX_BODY // 65536 + 2):
            yield b"y" * 65536
        yield b'"}'

    r = api.http.post(f"/v1/sessions/{sid}/messages", content=chunks(), headers={"Content-Type": "application/json"})
    error(r, 413, "too_large")


def test_invalid_utf8_is_400_and_a_lone_surrogate_is_422(api: Api, sid: str) -> None:
    headers = {"Content-Type": "application/json"}
    for raw in (b'{"text": "\xff\xfe"}', b'{"text": "caf\xc3"}', b"\xef\xbb\xbf\x80"):
        error(api.http.post(f"/v1/sessions/{sid}/messages", content=raw, headers=headers), 400, "bad_json")
    error(api.http.post(f"/v1/sessions/{sid}/messages", content=b"not json", headers=headers), 400, "bad_json")
    lone = '"\\ud800"'
    for path, text in ((f"/v1/sessions/{sid}/messages", f'{{"text": {lone}}}'),
                      (f"/v1/sessions/{sid}/messages", '{"text": "a\\udfffb", "mode": "queue"}'),
                      (f"/v1/sessions/{sid}/lead", f'{{"text": {lone}}}'),
                      (f"/v1/sessions/{sid}/observe", f'{{"command": {lone}}}'),
                      ("/v1/sessions", f'{{"workspace": {lone}}}')):
        detail = error(api.http.post(path, content=text.encode(), headers=headers), 422, "invalid")
        assert "surrogate" in detail, detail
    r = api.http.patch(f"/v1/sessions/{sid}", content=f'{{"title": {lone}}}'.encode(), headers=headers)
    error(r, 422, "invalid")


def test_bad_shapes_are_422(api: Api, sid: str) -> None:
    for body in ({}, {"text": ""}, {"text": "a", "mode": "later"}, {"text": "a", "extra": 1}, {"text": 5},
                 {"text": "a\x00b"}):
        error(api.http.post(f"/v1/sessions/{sid}/messages", json=body), 422, "invalid")


def test_nothing_was_recorded_by_the_bad_requests(api: Api, sid: str) -> None:
    evs = log_of(api, sid)
    assert [e["type"] for e in evs] == ["session.created"]
    view = api.session(sid)
    assert view["busy"] is False and view["queue"] == [] and view["leads"] == []


def test_no_model_chosen_is_not_accepting_for_send_queue_and_steer(api: Api) -> None:
    s = api.create("no-model")
    assert s["model"] is None
    for mode in (None, "queue", "steer"):
        detail = error(api.send(s["id"], "hello", mode=mode), 409, "not_accepting")
        assert "no model" in detail
    assert [e["type"] for e in log_of(api, s["id"])] == ["session.created"]
    # choosing one makes it accept
    assert api.http.patch(f"/v1/sessions/{s['id']}", json={"model": "script"}).status_code == 200
    r = api.send(s["id"], "hello")
    assert r.status_code == 202 and r.json()["disposition"] == "started", r.text
    api.wait_idle(s["id"])
    replay(log_of(api, s["id"]))


def test_a_model_that_is_no_longer_configured_is_not_accepting(stack: Stack, api: Api, tmp_path: Any) -> None:
    s = api.create("was-configured", model="gone")
    assert s["model"] == "gone"
    without = tmp_path / "without-gone.toml"
    without.write_text('[model]\ndefault = ""\n')
    for name in stack.runner_names():
        respawn(stack, name, env={"COX_CONFIG": str(without)})
    try:
        for mode in (None, "queue", "steer"):
            detail = error(api.send(s["id"], "hello", mode=mode), 409, "not_accepting")
            assert "gone" in detail and "not configured" in detail
        assert [e["type"] for e in log_of(api, s["id"])] == ["session.created"]
        assert api.session(s["id"])["busy"] is False
    finally:
        for name in stack.runner_names():
            respawn(stack, name, env={"COX_CONFIG": str(stack.tmp / "coxswain.toml")})


def test_create_false_refuses_a_workspace_that_does_not_exist_and_makes_no_folder(stack: Stack, api: Api) -> None:
    """``create: false`` (what the console sends unless "Create a new folder" is ticked): a typo is
    404 ``not_found`` and no folder appears; an existing folder opens; without the field (or with
    ``create: true``) a missing folder is created, as before."""
    (stack.root / "there").mkdir()
    before = {s["id"] for s in api.http.get("/v1/sessions").json()}
    for name in ("tehre", "there/deeper", str(stack.root / "absent")):
        detail = error(api.http.post("/v1/sessions", json={"workspace": name, "model": "script", "create": False}),
                       404, "not_found")
        assert "create" in detail, detail
    assert sorted(p.name for p in stack.root.iterdir() if p.name.startswith(("t", "a"))) == ["there"]
    assert not (stack.root / "there" / "deeper").exists()
    assert {s["id"] for s in api.http.get("/v1/sessions").json()} == before
    # Outside the root stays 422 invalid whatever create says.
    error(api.http.post("/v1/sessions", json={"workspace": "/etc", "create": False}), 422, "invalid")
    error(api.http.post("/v1/sessions", json={"workspace": "there", "create": "maybe"}), 422, "invalid")

    s = api.create("there", model="script", create=False)
    assert s["workspace"] == str((stack.root / "there").resolve())
    api.create(str(stack.root / "there"), model="script", create=False)
    api.create("new-by-default", model="script")
    api.create("new-on-request", model="script", create=True)
    assert (stack.root / "new-by-default").is_dir() and (stack.root / "new-on-request").is_dir()
