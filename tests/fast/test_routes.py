"""The gateway's routes as FastAPI matches them, in process (the runner's call recorded, not sent).

- The routers are tried in the order of ``app.ROUTERS`` (hot routes first, for time): no request
  is matched by routes of two routers, so that order decides nothing else.
- A send and a Lead take their principal in the route (``deps.caller``) rather than from a
  dependency, so FastAPI reads and validates their body first: a request without a good token
  must still be 401 whatever its body, and reach no runner; the OpenAPI document still says
  they need the bearer token.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Match

from cox_gateway.app import ROUTERS, create_app
from cox_gateway.auth import Auth
from cox_gateway.deps import Deps, Services
from cox_gateway.reads import SessionReads
from coxswain.config import Settings
from coxswain.models import LeadResult, SendResult

SID = "s_1m95tq53pfcky6t6nhaaaa"
TURN_ROUTES = [f"/v1/sessions/{SID}/messages", f"/v1/sessions/{SID}/lead"]


class Recorded(Services):
    """The runner's side: every call recorded, a send started, a Lead saved."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def call(self, op: Any, request: Any) -> Any:
        self.calls.append((op.name, request))
        if op.name == "send":
            return SendResult(message_id="m_1", disposition="started")
        return LeadResult(lead_id="l_1", pending=1, turn_id="t_1")


@pytest.fixture
def gateway(tmp_path: Path) -> tuple[TestClient, Recorded]:
    settings = Settings(root=tmp_path, auth={"tokens": {"good-token": "alice"}})
    services = Recorded()
    app = create_app(Deps(settings=settings, auth=Auth(settings.principals()), services=services,
                          reads=SessionReads(None, None, settings), streams=None,  # type: ignore[arg-type]
                          notifier=None))  # type: ignore[arg-type]
    return TestClient(app), services


def sample(path: str) -> str:
    """A path this template matches, each parameter a literal no template has."""
    return re.sub(r"\{[^}]+\}", "zz9", path)


def test_no_request_is_matched_by_routes_of_two_routers() -> None:
    routes = [(i, route) for i, router in enumerate(ROUTERS) for route in router.routes
              if isinstance(route, APIRoute)]
    assert len(routes) > 30
    both = []
    for i, a in routes:
        for method in getattr(a, "methods", None) or ():
            scope = {"type": "http", "method": method, "path": sample(a.path), "root_path": ""}
            for j, b in routes:
                if i != j and b.matches(scope)[0] == Match.FULL:
                    both.append((method, a.path, b.path))
    assert both == []


@pytest.mark.parametrize("path", TURN_ROUTES)
@pytest.mark.parametrize("auth", [None, "Bearer wrong-token", "Basic Z29vZC10b2tlbg==", "Bearer "])
@pytest.mark.parametrize("body", [{"text": "hello"}, {"text": 5}, {}, {"text": "x", "mode": "nonsense"}])
def test_a_turn_route_without_a_good_token_is_401_whatever_its_body(
        gateway: tuple[TestClient, Recorded], path: str, auth: str | None, body: dict[str, Any]) -> None:
    client, services = gateway
    r = client.post(path, json=body, headers={"Authorization": auth} if auth else {})
    assert r.status_code == 401, r.text
    assert r.json()["error"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    assert services.calls == []


@pytest.mark.parametrize("path", TURN_ROUTES)
def test_a_turn_route_with_a_good_token_validates_then_calls_the_runner_as_its_principal(
        gateway: tuple[TestClient, Recorded], path: str) -> None:
    client, services = gateway
    good = {"Authorization": "Bearer good-token"}
    bad = client.post(path, json={"text": 5}, headers=good)
    assert bad.status_code == 422 and bad.json()["error"] == "invalid"
    assert client.post(path, content=b"{not json", headers={**good, "content-type": "application/json"}
                       ).status_code == 400
    assert services.calls == []
    r = client.post(path, json={"text": "hello"}, headers=good)
    assert r.status_code == 202, r.text
    [(op, request)] = services.calls
    assert op == ("send" if path.endswith("/messages") else "lead")
    assert (request.principal, request.sid, request.text) == ("alice", SID, "hello")


def test_a_bad_json_body_without_a_token_is_400_as_before(gateway: tuple[TestClient, Recorded]) -> None:
    """FastAPI parses the body before it solves any dependency: a broken body was 400 ``bad_json``
    with or without a token, and still is (nothing of it is read)."""
    client, services = gateway
    r = client.post(TURN_ROUTES[0], content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "bad_json"
    assert services.calls == []


def test_the_turn_routes_declare_the_bearer_token_as_every_route_does(gateway: tuple[TestClient, Recorded]) -> None:
    client, _ = gateway
    paths = client.get("/openapi.json").json()["paths"]
    assert paths["/v1/sessions/{sid}/messages"]["post"]["security"] == [{"HTTPBearer": []}]
    assert paths["/v1/sessions/{sid}/lead"]["post"]["security"] == [{"HTTPBearer": []}]
    assert paths["/v1/sessions/{sid}/stop"]["post"]["security"] == [{"HTTPBearer": []}]
