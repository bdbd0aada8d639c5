"""A send answered by the gateway's fast path (``cox_gateway.turnpath``) is the route's answer.

The fast path takes a send as a client writes it (``Content-Type: application/json`` exactly, a
``Content-Length``, a good token, a body that fits) and answers it without FastAPI; everything
else goes on to the route. Here each request is sent twice to one app, in process (the runner's
side recorded): once as the fast path takes it, once with ``; charset=utf-8`` on its media type,
which the fast path leaves to FastAPI; status, headers, body and what reached the runner must be
the same. Then the attacks on what it reads itself: tokens (none, wrong, Basic, empty, two
headers), bodies (broken, in pieces, over the limit, a client that leaves), paths.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import redis.exceptions

from cox_gateway import metrics
from cox_gateway.app import create_app
from cox_gateway.auth import Auth
from cox_gateway.deps import Deps, Services
from cox_gateway.reads import SessionReads
from cox_gateway.turnpath import TurnPath
from coxswain.config import Settings
from coxswain.errors import Busy, CoxError, Unavailable
from coxswain.events import MAX_TEXT_BYTES
from coxswain.models import SendResult

SID = "s_1m95tq53pfcky6t6nhaaaa"
PATH = f"/v1/sessions/{SID}/messages"
TOKEN = b"Bearer good-token"
FAST = b"application/json"
ROUTE = b"application/json; charset=utf-8"
"""A media type FastAPI reads as JSON and the fast path leaves to it."""
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorded(Services):
    """The runner's side: every call recorded; answers ``result`` or raises it."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.result: Any = SendResult(message_id="m_1", disposition="started")

    async def call(self, op: Any, request: Any) -> Any:
        self.calls.append((op.name, request.model_dump()))
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


class Gateway:
    def __init__(self, root: Path) -> None:
        self.root = root
        settings = Settings(root=root, auth={"tokens": {"good-token": "alice"}}, max_body=4096)
        self.services = Recorded()
        self.app = create_app(Deps(settings=settings, auth=Auth(settings.principals()), services=self.services,
                                   reads=SessionReads(None, None, settings), streams=None,  # type: ignore[arg-type]
                                   notifier=None))  # type: ignore[arg-type]

    def served(self) -> int:
        """Sends the fast path answered so far."""
        assert isinstance(self.app.turnpath, TurnPath)
        return self.app.turnpath.served

    def request(self, headers: list[tuple[bytes, bytes]], chunks: list[bytes], *, path: str = PATH,
                method: str = "POST", leave: bool = False, sink: list[dict[str, Any]] | None = None,
                ) -> tuple[int, dict[bytes, bytes], bytes]:
        """One request through the whole app (its middleware too), as uvicorn hands it over: the
        body in ``chunks``; with ``leave``, the client goes away after the first chunk. ``sink``:
        where the messages sent are kept (read them there when the app raises)."""
        pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
        if leave:
            pending = [{"type": "http.request", "body": chunks[0], "more_body": True}]
        sent: list[dict[str, Any]] = [] if sink is None else sink

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop(0)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"testserver"), *headers], "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 8765)}
        asyncio.run(self.app(scope, receive, send))  # type: ignore[arg-type]
        if not sent:
            return 0, {}, b""
        start = sent[0]
        return (start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:]))

    def both(self, body: bytes, *extra: tuple[bytes, bytes], auth: bytes | None = TOKEN,
             length: bool | bytes = True, path: str = PATH) -> tuple[Any, Any]:
        """The same request through the fast path and through the route: (answer, runner's calls)
        each. ``length``: the body's own Content-Length (True), none (False), or this value."""
        out = []
        for ctype in (FAST, ROUTE):
            headers = [(b"content-type", ctype), *extra]
            if auth is not None:
                headers.append((b"authorization", auth))
            if length is not False:
                headers.append((b"content-length", length if isinstance(length, bytes) else str(len(body)).encode()))
            self.services.calls.clear()
            answer = self.request(headers, [body], path=path)
            out.append((answer, list(self.services.calls)))
        return out[0], out[1]


@pytest.fixture
def gw(tmp_path: Path) -> Gateway:
    return Gateway(tmp_path)


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(("sent", "extra", "result"), [
    (body(text="hello"), [], SendResult(message_id="m_1", disposition="started")),
    (body(text="héllo ✓ \"quoted\"", mode="queue", client_id="c-1"), [], SendResult(message_id="m_2", disposition="queued", position=3)),
    (body(text="steer it", mode="steer", attachments=["a_1", "a_2"]), [(b"traceparent", TRACEPARENT.encode())],
     SendResult(message_id="m_3", disposition="steered", position=1)),
    (body(text="x"), [(b"traceparent", b"not a traceparent")], SendResult(message_id="m_4", disposition="started")),
])
def test_a_send_the_fast_path_answers_is_the_routes_answer(
        gw: Gateway, sent: bytes, extra: list[tuple[bytes, bytes]], result: SendResult) -> None:
    gw.services.result = result
    before = gw.served()
    fast, route = gw.both(sent, *extra)
    assert gw.served() == before + 1, "one of the two took the fast path, the other the route"
    assert fast == route
    (status, headers, answer), calls = fast
    assert status == 202 and headers[b"content-type"] == b"application/json"
    assert json.loads(answer) == result.model_dump()
    assert len(calls) == 1 and calls[0][1]["principal"] == "alice" and calls[0][1]["sid"] == SID


@pytest.mark.parametrize("refusal", [
    Busy("a turn is running: choose queue or steer"), Unavailable("this turn-runner is shutting down; send again"),
    CoxError("the runner failed at /srv/secret/place"), redis.exceptions.ConnectionError("Connection refused"),
    nats.errors.TimeoutError(),
])
def test_the_runners_refusals_and_a_server_down_are_answered_as_the_route_answers(gw: Gateway, refusal: Exception) -> None:
    gw.services.result = refusal
    before = gw.served()
    fast, route = gw.both(body(text="hello"))
    assert gw.served() == before + 1
    assert fast == route
    (status, headers, answer), _ = fast
    assert status >= 400 and set(json.loads(answer)) == {"error", "detail"}
    assert b"/srv/secret" not in answer, "a service's failure names no host path"
    if status == 503:
        assert headers[b"retry-after"] == b"1", "docs/api.md: every 503 says when to retry"


REFUSED = [
    ("no token", body(text="hello"), [], {"auth": None}),
    ("wrong token", body(text="hello"), [], {"auth": b"Bearer wrong-token"}),
    ("basic", body(text="hello"), [], {"auth": b"Basic Z29vZC10b2tlbg=="}),
    ("empty bearer", body(text="hello"), [], {"auth": b"Bearer "}),
    ("two tokens, the bad one first", body(text="hello"), [(b"authorization", b"Bearer wrong-token")], {}),
    ("no token, a body that does not fit", body(text=5), [], {"auth": None}),
    ("no token, broken JSON (400 with or without one)", b"{not json", [], {"auth": None}),
    ("broken JSON", b'{"text": "hello"', [], {}),
    ("not UTF-8", b'{"text": "\xff\xfe"}', [], {}),
    ("JSON, not an object", b'["hello"]', [], {}),
    ("text not a string", body(text=5), [], {}),
    ("unknown mode", body(text="x", mode="nonsense"), [], {}),
    ("a field no send has", body(text="x", admin=True), [], {}),
    ("empty text", body(text=""), [], {}),
    ("text over the recordable bound", body(text="x" * (MAX_TEXT_BYTES + 1)), [], {}),
    ("over max_body", body(text="x" * 5000), [], {}),
    ("traceparent over 512", body(text="x"), [(b"traceparent", b"0" * 513)], {}),
    ("a session id too long", body(text="hello"), [], {"path": f"/v1/sessions/{'s' * 65}/messages"}),
]
UNAUTHORIZED = {"no token", "wrong token", "basic", "empty bearer", "two tokens, the bad one first",
                "no token, a body that does not fit"}


@pytest.mark.parametrize(("case", "sent", "extra", "kw"), REFUSED, ids=[c[0] for c in REFUSED])
def test_what_the_fast_path_does_not_take_is_refused_by_the_route(
        gw: Gateway, case: str, sent: bytes, extra: list[tuple[bytes, bytes]], kw: dict[str, Any]) -> None:
    fast, route = gw.both(sent, *extra, **kw)
    assert fast == route, case
    (status, headers, answer), calls = fast
    assert status >= 400 and calls == [], f"{case}: refused, and nothing reached a runner"
    if case in UNAUTHORIZED:
        assert status == 401 and headers[b"www-authenticate"] == b"Bearer", case
        assert b"good-token" not in answer and b"wrong-token" not in answer


LEFT = [
    ("no content-length (a streamed body)", {"length": False}),
    ("a path with a newline after", {"path": PATH + "\n"}),
    ("a path with a slash after", {"path": PATH + "/"}),
]


@pytest.mark.parametrize(("case", "kw"), LEFT, ids=[c[0] for c in LEFT])
def test_a_send_the_fast_path_leaves_is_the_routes_own(gw: Gateway, case: str, kw: dict[str, Any]) -> None:
    before = gw.served()
    fast, route = gw.both(body(text="hello"), **kw)
    assert fast == route, case
    assert gw.served() == before, f"{case}: left to FastAPI, whatever it answers"


def test_a_content_length_of_many_digits_is_not_read_as_a_number(gw: Gateway) -> None:
    huge = b"9" * 5000  # int() of it would raise: a 500 instead of the body limit's 413
    headers = [(b"content-type", FAST), (b"authorization", TOKEN), (b"content-length", huge)]
    before = gw.served()
    status, _, answer = gw.request(headers, [body(text="hello")])
    assert gw.served() == before and gw.services.calls == []
    assert status == 413 and json.loads(answer)["error"] == "too_large"


def test_two_tokens_the_good_one_first_is_the_token_the_route_reads(gw: Gateway) -> None:
    fast, route = gw.both(body(text="hello"), (b"authorization", b"Bearer wrong-token"), auth=None)
    assert fast == route and fast[0][0] == 401  # (only the bad one)
    headers = [(b"content-type", FAST), (b"authorization", TOKEN), (b"authorization", b"Bearer wrong"),
               (b"content-length", str(len(body(text="hello"))).encode())]
    status, _, _ = gw.request(headers, [body(text="hello")])
    headers[0] = (b"content-type", ROUTE)
    assert (status, gw.request(headers, [body(text="hello")])[0]) == (202, 202)


def test_a_body_in_pieces_is_read_whole_or_handed_on_whole(gw: Gateway) -> None:
    whole = body(text="in pieces")
    headers = [(b"content-type", FAST), (b"authorization", TOKEN), (b"content-length", str(len(whole)).encode())]
    before = gw.served()
    status, _, _ = gw.request(headers, [whole[:5], whole[5:9], whole[9:]])
    assert status == 202 and gw.served() == before + 1
    assert gw.services.calls[-1][1]["text"] == "in pieces"
    broken = b'{"text": "in pie'
    headers[2] = (b"content-length", str(len(broken)).encode())
    answer = gw.request(headers, [broken[:5], broken[5:]])
    headers[0] = (b"content-type", ROUTE)
    assert answer == gw.request(headers, [broken]), "the route reads the pieces the fast path read"
    assert answer[0] == 400


def test_a_client_that_leaves_before_its_body_is_whole_starts_nothing(gw: Gateway) -> None:
    whole = body(text="never whole")
    headers = [(b"content-type", FAST), (b"authorization", TOKEN), (b"content-length", str(len(whole)).encode())]
    status, _, _ = gw.request(headers, [whole[:6], whole[6:]], leave=True)
    assert status == 0 and gw.services.calls == [], "no answer and no send"


def test_other_methods_and_routes_go_on_untouched(gw: Gateway) -> None:
    before = gw.served()
    for method in ("GET", "PUT", "DELETE"):
        status, _, _ = gw.request([(b"authorization", TOKEN)], [b""], method=method)
        assert status == 405
    status, _, _ = gw.request([(b"content-type", FAST), (b"authorization", TOKEN), (b"content-length", b"2")], [b"{}"],
                              path=f"/v1/sessions/{SID}/lead")
    assert status == 422
    assert gw.served() == before


def test_a_send_the_fast_path_answers_is_counted_as_the_routes(gw: Gateway) -> None:
    counter = metrics.REQUESTS.labels("POST", "/v1/sessions/{sid}/messages", "202")
    before = counter._value.get()
    fast, _ = gw.both(body(text="hello"))
    assert fast[0][0] == 202
    assert counter._value.get() == before + 2, "the fast path's send and the route's, under one label"


def test_a_body_longer_than_its_content_length_says_is_still_held_to_max_body(gw: Gateway) -> None:
    big = body(text="x" * 5000)  # a server that does not hold a body to its Content-Length hands all of it on
    headers = [(b"content-type", FAST), (b"authorization", TOKEN), (b"content-length", b"20")]
    status, _, answer = gw.request(headers, [big[:20], big[20:]])
    assert status == 413 and json.loads(answer)["error"] == "too_large"
    assert gw.services.calls == []


def test_an_error_nothing_expects_is_a_500_as_the_route_answers_it_and_still_raised(gw: Gateway) -> None:
    """The fast path runs before FastAPI's server-error middleware: it answers as that does (a
    plain 500 with no detail) and raises on, so uvicorn logs it; the send is counted as a 500."""
    gw.services.result = RuntimeError("a bug at /srv/secret/place")
    counter = metrics.REQUESTS.labels("POST", "/v1/sessions/{sid}/messages", "500")
    before, served = counter._value.get(), gw.served()
    answers = []
    for ctype in (FAST, ROUTE):
        sent: list[dict[str, Any]] = []
        headers = [(b"content-type", ctype), (b"authorization", TOKEN), (b"content-length", b"16")]
        with pytest.raises(RuntimeError, match="a bug"):
            gw.request(headers, [body(text="hello")], sink=sent)
        answers.append((sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])))
    assert gw.served() == served + 1
    assert answers[0] == answers[1]
    assert answers[0][0] == 500 and answers[0][2] == b"Internal Server Error"
    assert counter._value.get() == before + 2


@pytest.mark.parametrize("zeros", [1, 8, 20, 5000])
def test_a_zero_padded_content_length_is_its_value_on_both_paths(gw: Gateway, zeros: int) -> None:
    # RFC 9110's Content-Length is 1*DIGIT: "000100" is 100. The fast path and the route's body
    # limit once read it apart (the route: more digits than the limit has is over it, a 413; the
    # fast path: 202 up to 12 digits), so one request had two answers by the path it took.
    sent = body(text="hello")
    fast, route = gw.both(sent, length=b"0" * zeros + str(len(sent)).encode())
    assert fast == route
    (status, _, answer), calls = fast
    assert status == 202 and json.loads(answer)["message_id"] == "m_1" and len(calls) == 1


@pytest.mark.parametrize("length", [b"0" * 30 + b"4097", b"0" * 5000 + b"9" * 5000, b"4097"])
def test_a_zero_padded_content_length_over_the_limit_is_413_on_both_paths(gw: Gateway, length: bytes) -> None:
    fast, route = gw.both(body(text="hello"), length=length)
    assert fast == route
    (status, _, answer), calls = fast
    assert status == 413 and json.loads(answer)["error"] == "too_large" and calls == []


@pytest.mark.parametrize("length", ["\u00b9\u00b2".encode("latin-1"), b"+20", b"2_0", b""])
def test_a_content_length_that_is_not_ascii_digits_is_no_length_and_no_500(gw: Gateway, length: bytes) -> None:
    # "¹²" is str.isdigit() in latin-1 (how headers decode) but int() refuses it: it was a 500
    sent = body(text="hello")
    before = gw.served()
    status, _, _ = gw.request([(b"content-type", FAST), (b"authorization", TOKEN), (b"content-length", length)], [sent])
    assert status != 500 and gw.served() == before, "not a length: the route's, and never a 500"
