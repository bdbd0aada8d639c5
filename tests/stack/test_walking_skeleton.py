"""One real turn flows through every service, visible as events."""

from __future__ import annotations

from pathlib import Path

from tests.support.stack import Api, Stack, script


def test_health_answers_for_all_five_services(api: Api) -> None:
    r = api.http.get("/healthz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body["services"]) == {"gateway", "turn-runner", "guard", "judge", "versions"}
    assert all(s["ok"] for s in body["services"].values())


def test_a_turn_with_a_write_runs_through_every_service(stack: Stack, api: Api) -> None:
    s = api.create("skeleton")
    assert s["model"] == "script" and s["busy"] is False
    text = script(
        {"text": "Writing.", "tools": [{"name": "write_file", "args": {"path": "out/a.txt", "content": "one\ntwo\n"}}]},
        {"tools": [{"name": "run_command", "args": {"command": "cat out/a.txt"}}]},
        {"text": "Done."},
    )
    r = api.send(s["id"], text)
    assert r.status_code == 202, r.text
    assert r.json()["disposition"] == "started"
    end = api.wait_type(s["id"], "turn.end")
    assert end["outcome"] == "completed"
    evs = api.all_events(s["id"])
    types = [e["type"] for e in evs]
    for needed in ("session.created", "user.msg", "turn.start", "tool.call", "policy.decision", "version.kept",
                   "file.written", "tool.result", "assistant.msg", "turn.end"):
        assert needed in types, f"{needed} missing from {types}"
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "seq rises by one with no gap"
    written = next(e for e in evs if e["type"] == "file.written")
    assert written == {**written, "path": "out/a.txt", "added": 2, "removed": 0}
    kept = next(e for e in evs if e["type"] == "version.kept")
    assert kept["store"] == "absent" and kept["path"] == "out/a.txt"
    decision = next(e for e in evs if e["type"] == "policy.decision")
    assert decision["verdict"] == "allow" and decision["actor"] == "setting"
    judged = [e for e in evs if e["type"] == "policy.decision" and e["actor"] == "judge"]
    assert judged and judged[0]["verdict"] == "allow", "cat goes through the rules judge"
    result = [e for e in evs if e["type"] == "tool.result"][-1]
    assert "one\ntwo" in result["output"]
    assert (Path(s["workspace"]) / "out" / "a.txt").read_text() == "one\ntwo\n"
    assert api.session(s["id"])["busy"] is False


def test_sse_stream_resumes_with_last_event_id(stack: Stack, api: Api) -> None:
    s = api.create("sse")
    api.send(s["id"], "hello there")
    api.wait_type(s["id"], "turn.end")
    seen: list[int] = []
    with api.http.stream("GET", f"/v1/sessions/{s['id']}/events", headers={"Last-Event-ID": "2"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("id: "):
                seen.append(int(line[4:]))
            if len(seen) >= 3:
                break
    assert seen[:3] == [3, 4, 5]


def test_requests_need_a_token_and_other_principals_see_nothing(stack: Stack, api: Api) -> None:
    s = api.create("mine")
    anon = api.http.get(f"/v1/sessions/{s['id']}", headers={"Authorization": ""})
    assert anon.status_code == 401 and anon.json()["error"] == "unauthorized"
    bad = api.http.get(f"/v1/sessions/{s['id']}", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    from tests.support.stack import OTHER_TOKEN

    with stack.client(OTHER_TOKEN) as other:
        for method, path in (("GET", ""), ("GET", "/events?format=json"), ("POST", "/stop")):
            r = other.http.request(method, f"/v1/sessions/{s['id']}{path}")
            assert r.status_code == 404, (method, path, r.text)
        r = other.send(s["id"], "not yours")
        assert r.status_code == 404
        assert all(x["id"] != s["id"] for x in other.http.get("/v1/sessions").json())


def test_metrics_count_requests_by_route(stack: Stack, api: Api) -> None:
    s = api.create("metrics")
    assert api.send(s["id"], "count me").status_code == 202
    api.wait_type(s["id"], "turn.end")
    r = api.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    sent = [x for x in lines if x.startswith("cox_http_requests_total{")
            and 'route="/v1/sessions/{sid}/messages"' in x and 'status="202"' in x]
    assert sent and float(sent[0].rsplit(" ", 1)[1]) >= 1
    assert any(x.startswith("cox_http_request_seconds_bucket{") for x in lines)
