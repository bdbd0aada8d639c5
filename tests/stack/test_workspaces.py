"""Workspaces belong to principals (issue 21, item 6), through HTTP against a real stack.

Two principals: ``local`` (the stack's TOKEN, also the operator's local principal) and
``other`` (OTHER_TOKEN). A workspace is never the root itself, in any spelling; never inside or
around another; another principal's workspace is invisible (listing) and answers 404 on
``POST /v1/sessions`` unless ``[[auth.shares]]`` shares it; two principals racing for one new
name: exactly one owns it. Every refusal creates nothing (no session, no folder, no record).
The module runs on one Redis and (the cluster tier) on a Redis Cluster: the claim is one call on
the ``{ws}`` slot.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx

from coxswain import keys
from tests.support.flow import run_turn
from tests.support.stack import OTHER_TOKEN, TOKEN, Api, Stack, said, stack_fixture

CONFIG = """
[approval]
commands = "allow"

[[auth.shares]]
workspace = "shared-w"
principals = ["other"]
"""

stack = stack_fixture("owners", runners=2, config=CONFIG, also_cluster=True)


def error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error", "detail"} and body["error"] == code and body["detail"], body
    return str(body["detail"])


def sessions(api: Api) -> set[str]:
    r = api.http.get("/v1/sessions", params={"limit": 500})
    assert r.status_code == 200, r.text
    return {s["id"] for s in r.json()}


def listed(api: Api) -> list[str]:
    r = api.http.get("/v1/workspaces")
    assert r.status_code == 200, r.text
    return list(r.json()["workspaces"])


def post(api: Api, workspace: str, **kw: Any) -> httpx.Response:
    return api.http.post("/v1/sessions", json={"workspace": workspace, "model": "script", **kw})


def tree(root: Path) -> set[str]:
    """Every path under the root (what a refusal must leave as it was)."""
    return {str(Path(d, n).relative_to(root)) for d, ds, fs in os.walk(root) for n in ds + fs}


def test_the_root_itself_is_never_a_workspace(stack: Stack) -> None:
    root = stack.root
    (root / "self-link").symlink_to(root)
    (root / "up").mkdir()
    (root / "up" / "to-root").symlink_to("..")
    variants = [".", "./", " . ", "a/..", "./a/../.", "up/..", "up/to-root", "self-link", "self-link/.",
                str(root), str(root) + "/", str(root) + "/.", str(root) + "/up/..", str(root / "self-link"),
                os.path.realpath(root)]
    with stack.client() as api, stack.client(OTHER_TOKEN) as other:
        for who in (api, other):
            before, files = sessions(who), tree(root)
            for v in variants:
                for create in (True, False):
                    detail = error(post(who, v, create=create), 422, "workspace_invalid")
                    assert "root" in detail and str(root) not in detail, detail
            error(post(who, ""), 422, "invalid")
            assert sessions(who) == before and tree(root) == files
        # the store folder is no workspace either, nor anything in one
        for v in (".coxswain", "w-store/.coxswain", ".coxswain/x"):
            error(post(api, v), 422, "workspace_invalid")
        assert not (root / ".coxswain").exists() and not (root / "w-store").exists()


def test_a_session_made_on_the_root_before_the_rule_runs_nothing(stack: Stack) -> None:
    """A session recorded on the root (as the old code let one be made) is refused a send and a
    ``!command`` (422 ``workspace_invalid``): its commands would reach every workspace."""
    with stack.client() as api:
        sid = api.create("legacy-root", model="script")["id"]
        stack.redis_client().hset(keys.session(sid), "workspace", str(stack.root))
        error(api.send(sid, "hi"), 422, "workspace_invalid")
        error(api.http.post(f"/v1/sessions/{sid}/observe", json={"command": "touch /tmp/x"}), 422,
              "workspace_invalid")
        assert not any(e["type"] in ("user.msg", "observed") for e in api.all_events(sid))


def test_nested_workspaces_are_refused_both_ways(stack: Stack) -> None:
    root = stack.root
    with stack.client() as api, stack.client(OTHER_TOKEN) as other:
        assert post(api, "n1").status_code == 201
        assert post(other, "n2/d").status_code == 201
        before = (sessions(api), sessions(other))
        for who in (api, other):
            for v in ("n1/d", "n1/d/e", "./n1/x/..//y", str(root / "n1" / "z")):
                error(post(who, v), 409, "workspace_nested")
            error(post(who, "n2"), 409, "workspace_nested")
        # the owner of n2/d cannot take its parent either, nor a folder inside its own workspace
        error(post(other, "n2/d/inner"), 409, "workspace_nested")
        # a link that resolves inside another workspace is that folder: nested too
        (root / "link-into-n1").symlink_to(root / "n1")
        error(post(other, "link-into-n1/sub"), 409, "workspace_nested")
        assert (sessions(api), sessions(other)) == before
        assert not (root / "n1" / "d").exists() and not (root / "n2" / "d" / "inner").exists()
        assert not (root / "n1" / "z").exists() and not (root / "n1" / "sub").exists()
        # siblings are fine
        assert post(other, "n2/e").status_code == 201


def test_another_principals_workspace_is_invisible(stack: Stack) -> None:
    root = stack.root
    with stack.client() as alice, stack.client(OTHER_TOKEN) as bob:
        a = post(alice, "alice-ws")
        assert a.status_code == 201, a.text
        b = post(bob, "bob-ws")
        assert b.status_code == 201, b.text
        assert "alice-ws" in listed(alice) and "bob-ws" not in listed(alice)
        assert "bob-ws" in listed(bob) and "alice-ws" not in listed(bob)
        before = (sessions(alice), sessions(bob))
        files = tree(root)
        for create in (True, False):
            for v in ("alice-ws", "./alice-ws", str(root / "alice-ws"), "alice-ws/", "up/../alice-ws"):
                detail = error(post(bob, v, create=create), 404, "not_found")
                assert str(root) not in detail
            error(post(alice, "bob-ws", create=create), 404, "not_found")
        # a link of one's own to another's workspace is that workspace
        os.symlink(root / "alice-ws", root / "bob-link")
        error(post(bob, "bob-link"), 404, "not_found")
        os.unlink(root / "bob-link")
        assert (sessions(alice), sessions(bob)) == before and tree(root) == files
        # the owner still opens more sessions there
        assert post(alice, "alice-ws").status_code == 201


def test_a_folder_nobody_claimed_is_the_local_principals(stack: Stack) -> None:
    """A folder under the root with no recorded owner (made before owners were recorded, or by
    the operator) belongs to the local principal; others get 404 until it is shared."""
    (stack.root / "by-hand").mkdir()
    (stack.root / "by-hand" / "README").write_text("the operator's")
    with stack.client() as local, stack.client(OTHER_TOKEN) as other:
        assert "by-hand" in listed(local) and "by-hand" not in listed(other)
        error(post(other, "by-hand"), 404, "not_found")
        assert stack.redis_client().hget(keys.WS_OWNERS, "by-hand") is None, "a refusal records nothing"
        assert post(local, "by-hand", create=False).status_code == 201
        assert stack.redis_client().hget(keys.WS_OWNERS, "by-hand") == "local"
        error(post(other, "by-hand"), 404, "not_found")


def test_a_shared_workspace_is_usable_by_whom_it_is_shared_with(stack: Stack) -> None:
    with stack.client() as alice, stack.client(OTHER_TOKEN) as bob:
        a = post(alice, "shared-w")
        assert a.status_code == 201, a.text
        (Path(a.json()["workspace"]) / "plan.txt").write_text("ours")
        assert "shared-w" in listed(bob)
        b = post(bob, "shared-w", create=False)
        assert b.status_code == 201, b.text
        assert b.json()["workspace"] == a.json()["workspace"]
        # shared is not owned: the record names alice, and bob's sessions stay his own
        assert stack.redis_client().hget(keys.WS_OWNERS, "shared-w") == "local"
        assert b.json()["id"] not in sessions(alice)
        r = alice.http.get(f"/v1/sessions/{b.json()['id']}")
        assert r.status_code == 404


def test_a_fork_is_a_workspace_of_the_forking_principal(stack: Stack) -> None:
    with stack.client() as alice, stack.client(OTHER_TOKEN) as bob:
        s = alice.create("to-fork", model="script")
        evs = run_turn(alice, s["id"], said("one", {"tools": [{"name": "write_file",
                                                                "args": {"path": "a.txt", "content": "1"}}]},
                                            {"text": "done"}))
        assert [e["outcome"] for e in evs if e["type"] == "turn.end"] == ["completed"], evs
        r = alice.http.post(f"/v1/sessions/{s['id']}/fork", json={"at_turn": 1})
        assert r.status_code == 201, r.text
        assert Path(r.json()["workspace"]).name == "to-fork-fork-1"
        assert stack.redis_client().hget(keys.WS_OWNERS, "to-fork-fork-1") == "local"
        assert "to-fork-fork-1" in listed(alice) and "to-fork-fork-1" not in listed(bob)
        error(post(bob, "to-fork-fork-1"), 404, "not_found")
        # a name another principal already owns is skipped: bob holds to-fork-fork-2 (no folder yet)
        assert stack.redis_client().hset(keys.WS_OWNERS, "to-fork-fork-2", "other") == 1
        stack.redis_client().zadd(keys.WS_NAMES, {"to-fork-fork-2": 0})
        r = alice.http.post(f"/v1/sessions/{s['id']}/fork", json={"at_turn": 1})
        assert r.status_code == 201, r.text
        assert Path(r.json()["workspace"]).name == "to-fork-fork-3"
        assert stack.redis_client().hget(keys.WS_OWNERS, "to-fork-fork-3") == "local"


async def _race(url: str, name: str, n: int) -> list[tuple[str, int]]:
    tokens = {"local": TOKEN, "other": OTHER_TOKEN}
    clients = {who: httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {t}"}, timeout=60)
               for who, t in tokens.items()}
    try:
        whos = [("local", "other")[i % 2] for i in range(n)]
        res = await asyncio.gather(*(clients[w].post("/v1/sessions", json={"workspace": name, "model": "script"})
                                     for w in whos))
        return [(w, r.status_code) for w, r in zip(whos, res, strict=True)]
    finally:
        for c in clients.values():
            await c.aclose()


def test_two_principals_racing_for_one_new_workspace_exactly_one_owns_it(stack: Stack) -> None:
    r = stack.redis_client()
    for i in range(6):
        name = f"race-{i}"
        out = asyncio.run(_race(stack.url, name, 24))
        won = {w for w, status in out if status == 201}
        assert len(won) == 1, out
        (winner,) = won
        assert all(status == 201 for w, status in out if w == winner), out
        assert all(status == 404 for w, status in out if w != winner), out
        assert r.hget(keys.WS_OWNERS, name) == winner
        loser = "other" if winner == "local" else "local"
        assert name not in r.zrange(keys.ws_principal(loser), 0, -1)
        assert name in r.zrange(keys.ws_principal(winner), 0, -1)
    # a race for a workspace and one inside it: never both
    for i in range(4):
        async def both(i: int = i) -> list[int]:
            async with httpx.AsyncClient(base_url=stack.url, headers={"Authorization": f"Bearer {TOKEN}"},
                                         timeout=60) as a, \
                    httpx.AsyncClient(base_url=stack.url, headers={"Authorization": f"Bearer {OTHER_TOKEN}"},
                                      timeout=60) as b:
                rs = await asyncio.gather(a.post("/v1/sessions", json={"workspace": f"pair-{i}"}),
                                          b.post("/v1/sessions", json={"workspace": f"pair-{i}/in"}))
                return [x.status_code for x in rs]
        codes = asyncio.run(both())
        assert sorted(codes) in ([201, 409], [201, 404]), codes


def test_error_details_name_no_host_path(stack: Stack) -> None:
    """Issue 21 item 7: bad input that used to answer with the root's host path in the detail
    (``workspace must be under /…/workspaces``, ``'/…/workspaces/../x' is outside the
    workspace``) or a 500 (a name over 255 bytes) answers a clear error naming no host folder."""
    host = [str(stack.root), os.path.realpath(stack.root), str(stack.tmp)]
    with stack.client() as api:
        sid = api.create("paths", model="script")["id"]
        probes = [
            (post(api, "../outside"), 422, "invalid"), (post(api, "/etc"), 422, "invalid"),
            (post(api, "paths/../../x"), 422, "invalid"), (post(api, str(stack.tmp)), 422, "invalid"),
            (post(api, "n" * 300), 422, "invalid"), (post(api, "ok/" + "n" * 256), 422, "invalid"),
            (post(api, "paths/sub"), 409, "workspace_nested"), (post(api, "."), 422, "workspace_invalid"),
            (api.http.get(f"/v1/sessions/{sid}/versions", params={"path": "../../x"}), 403, "refused"),
            (api.http.get(f"/v1/sessions/{sid}/versions", params={"path": "/".join(["d"] * 200)}), 422, "invalid"),
        ]
        for r, status, code in probes:
            detail = error(r, status, code)
            assert not any(h in r.text for h in host), (r.request.url, r.text)
            assert "internal" not in detail, detail
