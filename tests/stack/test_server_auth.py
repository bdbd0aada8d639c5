"""Servers that admit only coxswain (Confinement, part 4), against real nats-server and redis-server.

Every service is its own user on NATS and on Redis with only the rights ``coxswain.access``
gives it; a client without credentials (a model's shell command) gets nowhere; no password
reaches a log. The refusals are observed the way a client sees them: nats-server's permission
errors through nats-py's error callback (and no subscriber receiving the message), Redis's
``NOAUTH``/``WRONGPASS``/``NOPERM``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import psutil
import pytest
import redis
import redis.exceptions
from nats.aio.client import Client
from redis.backoff import NoBackoff
from redis.retry import Retry

from cox.creds import Credentials
from cox.servers import NatsServer, RedisServer, free_port
from coxswain import access, keys, service, subjects
from coxswain.errors import Unavailable
from coxswain.logs import redact_url
from coxswain.proc import foreign_env
from tests.support.flow import answer, next_approval
from tests.support.library import Library
from tests.support.stack import Api, Stack, script, stack_fixture

stack = stack_fixture("auth", runners=1)
VIOLATION_MARKS = ("permissions violation", "NOPERM", "no permissions")


# ------------------------------------------------------------------ helpers


class Conn:
    """A NATS connection as one user that keeps every asynchronous error the server sends."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Client | None = None

    async def open(self, url: str, user: str | None, password: str | None, inbox: str = "_INBOX") -> Conn:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        # A cluster's URL lists every node (comma-separated): nats-py takes them as a list.
        nc = Client()
        try:
            await nc.connect(url.split(","), user=user, password=password, inbox_prefix=inbox, error_cb=on_error,
                             allow_reconnect=False, connect_timeout=2)
        except BaseException:
            await service.close_quietly(nc)  # nats-py leaves a refused connection's socket open
            raise
        self.nc = nc
        return self

    async def settle(self) -> None:
        assert self.nc is not None
        await self.nc.flush()
        await asyncio.sleep(0.3)  # a permission error arrives after the PONG of the flush at worst

    def refused(self, kind: str, subject: str) -> bool:
        return any(f'permissions violation for {kind} to "{subject}"'.lower() in e.lower() for e in self.errors)


async def as_user(stack: Stack, user: str) -> Conn:
    return await Conn().open(stack.nats.url, user, stack.credentials.nats[user], subjects.inbox(user))


async def as_admin(stack: Stack) -> Conn:
    return await Conn().open(stack.nats.url, access.ADMIN, stack.credentials.nats[access.ADMIN])


def redis_as(stack: Stack, user: str | None, password: str | None = None) -> redis.Redis:
    if user is not None and password is None:
        password = stack.credentials.redis[user]
    # No retries: redis-py retries a refused AUTH (an AuthenticationError is a ConnectionError)
    # with backoff, ~4 s a refusal, for an answer that cannot change.
    return redis.Redis(host="127.0.0.1", port=stack.redis.port, username=user, password=password,
                       decode_responses=True, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def log_sizes(stack: Stack) -> dict[Path, int]:
    return {p: p.stat().st_size for p in stack.logs.glob("*.log")}


def logged_since(stack: Stack, sizes: dict[Path, int]) -> list[str]:
    out: list[str] = []
    for p in stack.logs.glob("*.log"):
        with open(p, "rb") as f:
            f.seek(sizes.get(p, 0))
            out += f.read().decode(errors="replace").splitlines()
    return out


# ------------------------------------------------------------------ every service has what it needs


def test_a_turn_through_every_service_needs_no_right_a_service_lacks(stack: Stack, api: Api) -> None:
    """Run what touches every permission (admission, guard, judge, an approval, keep, versions
    list/diff/changes/restore/undo, patch, stop, the event log as JSON and SSE, health): no
    service is refused anything, by nats-server or by Redis."""
    with redis_as(stack, access.ADMIN) as admin:
        admin.acl_log_reset()
    sizes = log_sizes(stack)
    s = api.create("auth-all")
    sid = s["id"]
    r = api.send(sid, script(
        {"text": "Writing.", "tools": [{"name": "write_file", "args": {"path": "a.txt", "content": "one\n"}}]},
        {"tools": [{"name": "write_file", "args": {"path": "a.txt", "content": "two\n"}}]},
        {"tools": [{"name": "run_command", "args": {"command": "cat a.txt"}}]},
        {"tools": [{"name": "run_command", "args": {"command": "touch b.txt"}}]},  # the judge refuses: ask
        {"text": "Done."},
    ))
    assert r.status_code == 202, r.text
    pending = next_approval(api, sid)
    answer(api, sid, pending["approval_id"], "allow")
    assert api.wait_type(sid, "turn.end", timeout=30)["outcome"] == "completed"
    assert (Path(s["workspace"]) / "b.txt").exists()
    vs = api.http.get(f"/v1/sessions/{sid}/versions", params={"path": "a.txt"}).json()["versions"]
    assert vs, "versions kept"
    assert api.http.get(f"/v1/sessions/{sid}/versions/{vs[0]['version_id']}/diff").status_code == 200
    assert api.http.get(f"/v1/sessions/{sid}/changes").status_code == 200
    assert api.http.post(f"/v1/sessions/{sid}/versions/{vs[0]['version_id']}/restore").status_code == 200
    assert api.http.post(f"/v1/sessions/{sid}/undo").status_code == 200
    assert api.http.patch(f"/v1/sessions/{sid}", json={"title": "renamed"}).status_code == 200
    assert api.http.post(f"/v1/sessions/{sid}/stop").status_code == 200
    with api.http.stream("GET", f"/v1/sessions/{sid}/events") as sse:
        assert any(line.startswith("id: ") for line in sse.iter_lines())
    evs = api.all_events(sid)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    assert api.http.get("/healthz").status_code == 200
    assert api.http.get("/v1/sessions").status_code == 200

    refused = [line for line in logged_since(stack, sizes) if any(m in line for m in VIOLATION_MARKS)]
    assert refused == [], refused
    with redis_as(stack, access.ADMIN) as admin:
        assert admin.acl_log() == [], "Redis refused a service something"


# ------------------------------------------------------------------ NATS


def test_nats_refuses_a_client_without_or_with_wrong_credentials(stack: Stack) -> None:
    async def attempt(user: str | None, password: str | None) -> str:
        try:
            conn = await Conn().open(stack.nats.url, user, password)
        except nats.errors.Error as exc:
            return str(exc)
        assert conn.nc is not None
        await conn.nc.close()
        return "connected"

    assert "Authorization Violation" in asyncio.run(attempt(None, None))
    assert "Authorization Violation" in asyncio.run(attempt(subjects.GATEWAY, "not-the-password"))
    assert "Authorization Violation" in asyncio.run(attempt("nobody", "x"))
    assert asyncio.run(attempt(subjects.GATEWAY, stack.credentials.nats[subjects.GATEWAY])) == "connected"


def test_the_gateway_may_not_publish_events_ring_runners_or_call_what_the_runner_calls(stack: Stack) -> None:
    forbidden = [
        subjects.events("s_forged"),                       # write into a session's log
        subjects.control("r_someone"),                     # doorbell: runner-only
        subjects.rpc(subjects.GUARD, "check"),             # the runner's calls, not the gateway's
        subjects.rpc(subjects.JUDGE, "decide"),
        subjects.rpc(subjects.VERSIONS, "keep"),
        "$JS.API.STREAM.DELETE." + subjects.EVENTS_STREAM,  # erase the log
        "$JS.API.STREAM.PURGE." + subjects.EVENTS_STREAM,
        "$JS.API.STREAM.UPDATE." + subjects.EVENTS_STREAM,
    ]

    async def run() -> None:
        admin = await as_admin(stack)
        gw = await as_user(stack, subjects.GATEWAY)
        assert admin.nc is not None and gw.nc is not None
        seen: list[str] = []

        async def got(msg: Any) -> None:
            seen.append(msg.subject)

        for subj in forbidden:
            await admin.nc.subscribe(subj, cb=got)
        await admin.nc.flush()
        for subj in forbidden:
            await gw.nc.publish(subj, b'{"forged": true}')
        await gw.settle()
        # What the gateway may do still works on the same connection: ask the runner's health.
        reply = await gw.nc.request(subjects.rpc(subjects.RUNNER, "health"), b"{}", timeout=5)
        assert json.loads(reply.data)["ok"] is True
        await asyncio.sleep(0.2)
        assert seen == [], f"a subscriber received what the gateway may not publish: {seen}"
        for subj in forbidden:
            assert gw.refused("publish", subj), (subj, gw.errors)
        js = admin.nc.jetstream()
        info = await js.stream_info(subjects.EVENTS_STREAM)
        assert info.config.deny_delete and info.config.deny_purge
        await gw.nc.close()
        await admin.nc.close()

    asyncio.run(run())


def test_guard_may_only_answer_its_own_subjects(stack: Stack) -> None:
    others = [
        subjects.rpc(subjects.RUNNER, "answer"),     # approve its own approvals
        subjects.rpc(subjects.VERSIONS, "keep"),
        subjects.EVENTS_WILDCARD,
        subjects.CONTROL_WILDCARD,
        "_INBOX.>",                                  # every reply on the bus
        f"{subjects.inbox(subjects.GATEWAY)}.>",     # the gateway's replies
    ]

    async def run() -> None:
        admin = await as_admin(stack)
        guard = await as_user(stack, subjects.GUARD)
        assert admin.nc is not None and guard.nc is not None
        stolen: list[str] = []

        async def steal(msg: Any) -> None:
            stolen.append(msg.subject)

        for subj in others:
            await guard.nc.subscribe(subj, cb=steal)
        # It does answer on its own subject (allow_responses: the reply to the requester's inbox).
        async def serve(msg: Any) -> None:
            await msg.respond(b"guarded")

        await guard.nc.subscribe(subjects.rpc(subjects.GUARD, "auth-probe"), cb=serve)
        await guard.settle()
        await admin.nc.publish(f"{subjects.inbox(subjects.GATEWAY)}.x.y", b"a reply meant for the gateway")
        reply = await admin.nc.request(subjects.rpc(subjects.GUARD, "auth-probe"), b"", timeout=5)
        assert reply.data == b"guarded"
        await guard.nc.publish(subjects.rpc(subjects.RUNNER, "answer"), b"{}")
        await guard.settle()
        assert stolen == []
        for subj in others:
            assert guard.refused("subscription", subj), (subj, guard.errors)
        assert guard.refused("publish", subjects.rpc(subjects.RUNNER, "answer"))
        await guard.nc.close()
        await admin.nc.close()

    asyncio.run(run())


def test_no_service_may_read_another_services_replies(stack: Stack) -> None:
    async def run() -> None:
        for user in subjects.SERVICES:
            conn = await as_user(stack, user)
            assert conn.nc is not None
            theirs = [f"{subjects.inbox(other)}.>" for other in subjects.SERVICES if other != user]
            for subj in theirs:
                await conn.nc.subscribe(subj)
            await conn.settle()
            for subj in theirs:
                assert conn.refused("subscription", subj), (user, subj, conn.errors)
            await conn.nc.close()

    asyncio.run(run())


def test_only_the_runner_publishes_events_and_even_it_may_not_delete_or_purge_the_stream(stack: Stack) -> None:
    async def run() -> None:
        runner = await as_user(stack, subjects.RUNNER)
        assert runner.nc is not None
        for verb in ("DELETE", "PURGE", "MSG.DELETE"):
            await runner.nc.publish(f"$JS.API.STREAM.{verb}.{subjects.EVENTS_STREAM}", b"{}")
        await runner.settle()
        for verb in ("DELETE", "PURGE", "MSG.DELETE"):
            assert runner.refused("publish", f"$JS.API.STREAM.{verb}.{subjects.EVENTS_STREAM}"), runner.errors
        for user in (subjects.GATEWAY, subjects.GUARD, subjects.JUDGE, subjects.VERSIONS):
            conn = await as_user(stack, user)
            assert conn.nc is not None
            await conn.nc.publish(subjects.events("s_forged"), b"{}")
            await conn.settle()
            assert conn.refused("publish", subjects.events("s_forged")), (user, conn.errors)
            await conn.nc.close()
        await runner.nc.close()

    asyncio.run(run())


# ------------------------------------------------------------------ Redis


def test_redis_refuses_a_client_without_or_with_a_wrong_password(stack: Stack) -> None:
    # What `redis-cli ping` in a model's shell sends, byte for byte.
    with socket.create_connection(("127.0.0.1", stack.redis.port), timeout=5) as raw:
        raw.sendall(b"PING\r\n")
        assert raw.recv(200).startswith(b"-NOAUTH Authentication required")
    with redis_as(stack, None) as anon, pytest.raises(redis.exceptions.AuthenticationError):
        anon.ping()
    with redis_as(stack, None, "not-the-password") as wrong, pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()
    with redis_as(stack, subjects.GATEWAY, "not-the-password") as wrong, \
            pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()
    for user in (subjects.GUARD, subjects.JUDGE):  # no Redis user: they never touch it
        with redis_as(stack, user, stack.credentials.nats[user]) as nope, \
                pytest.raises(redis.exceptions.AuthenticationError):
            nope.ping()
    with redis_as(stack, subjects.GATEWAY) as gw:
        assert gw.ping() is True


def test_each_redis_user_has_only_what_its_service_does(stack: Stack, api: Api) -> None:
    sid = api.create("auth-redis")["id"]
    session = keys.session(sid)
    refused = redis.exceptions.NoPermissionError
    deny: Callable[[], Any]
    with redis_as(stack, subjects.GATEWAY) as gw:
        assert gw.hget(session, "seq") is not None                   # it reads sessions
        assert gw.hget(keys.META, "buckets") == str(keys.buckets())   # ... and the bucket count
        for deny in (lambda: gw.hset(session, "principal", "me"),  # ... and writes nothing
                     lambda: gw.delete(session),
                     lambda: gw.get(keys.VERSIONS_MAC_KEY),
                     lambda: gw.hset(keys.META, "buckets", "1"),    # the bucket count is the runner's
                     lambda: gw.flushall(),
                     lambda: gw.keys("*"),
                     lambda: gw.config_set("appendonly", "no"),
                     lambda: Library(gw).queued(Library(gw).fns.renew, sid=sid, token="1", lease_ms=1000)):
            with pytest.raises(refused):
                deny()
    with redis_as(stack, subjects.VERSIONS) as vs:
        assert vs.get(keys.VERSIONS_MAC_KEY)                         # its own key
        assert vs.hget(session, "seq") is not None
        for deny in (lambda: vs.hset(session, "seq", "0"), lambda: vs.delete(session),
                     lambda: vs.zrevrange(keys.principal("local"), 0, -1), lambda: vs.flushdb()):
            with pytest.raises(refused):
                deny()
    with redis_as(stack, subjects.RUNNER) as rn:
        assert rn.hget(session, "seq") is not None
        assert rn.config_get("appendfsync")["appendfsync"] == "always"  # its durability check
        for deny in (lambda: rn.get(keys.VERSIONS_MAC_KEY),        # versions' MAC key is not its
                     lambda: rn.set("elsewhere", "x"),
                     lambda: rn.flushall(),
                     lambda: rn.keys("*"),
                     lambda: rn.config_set("appendonly", "no"),
                     lambda: rn.acl_setuser("me", enabled=True)):
            with pytest.raises(refused):
                deny()
    with redis_as(stack, access.ADMIN) as admin:
        assert admin.hget(session, "principal") == "local", "nothing the refused users tried went through"


def test_a_redis_restart_replays_every_transition_of_the_log(stack: Stack, api: Api) -> None:
    """Redis replays its AOF as ``default``; were that user restricted, the MULTI/EXEC of every
    function call would be refused on replay and sessions silently lost (access.redis_users)."""
    s = api.create("auth-aof")
    api.send(s["id"], "before the restart")
    api.wait_type(s["id"], "turn.end")
    with redis_as(stack, access.ADMIN) as admin:
        before = admin.hgetall(keys.session(s["id"]))
    stack.redis.stop()
    stack.redis.start()
    with redis_as(stack, access.ADMIN) as admin:
        assert admin.hgetall(keys.session(s["id"])) == before
    if isinstance(stack.redis, RedisServer):
        assert "CRITICAL" not in stack.redis.log_path.read_text(errors="replace")
    deadline = time.monotonic() + 30
    while api.http.get(f"/v1/sessions/{s['id']}").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert api.session(s["id"])["id"] == s["id"]


# ------------------------------------------------------------------ no password in a log


def test_no_log_and_no_command_line_of_the_stack_holds_a_password(stack: Stack) -> None:
    secrets = stack.credentials.passwords()
    files = [*stack.logs.glob("*.log")]
    files += [p for p in (getattr(stack.nats, "log_path", None), getattr(stack.redis, "log_path", None)) if p]
    assert files
    for path in files:
        text = path.read_text(errors="replace")
        leaked = [s for s in secrets if s in text]
        assert leaked == [], f"{path.name} holds a password"
    cmdlines = [" ".join(psutil.Process(p.pid).cmdline()) for p in stack.procs.values() if p.poll() is None]
    for server in (stack.nats, stack.redis):
        if getattr(server, "proc", None) is not None:
            cmdlines.append(" ".join(psutil.Process(server.proc.pid).cmdline()))
    assert not [c for c in cmdlines if any(s in c for s in secrets)], "a password on a command line"
    nats_conf = stack.nats.workdir / "nats.conf" if hasattr(stack.nats, "workdir") else None
    if nats_conf is not None and nats_conf.exists():
        assert stat.S_IMODE(nats_conf.stat().st_mode) == 0o600


def test_a_url_with_a_password_is_logged_redacted() -> None:
    assert redact_url("nats://gateway:s3cret@127.0.0.1:4222") == "nats://gateway:***@127.0.0.1:4222"
    assert redact_url("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("nats://tok3n@h:4222") == "nats://***@h:4222"
    assert redact_url("nats://a:x@h1,nats://a:y@h2") == "nats://a:***@h1,nats://a:***@h2"
    assert redact_url("redis://u:p/a@ss@h/0") == "redis://u:***@h/0"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_failing_to_connect_with_a_password_in_the_url_never_logs_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every retry's log line and the final error name the server with the password redacted:
    a NATS URL nats-py cannot use, a real Redis refusing the URL's password."""
    monkeypatch.setattr(service, "CONNECT_ATTEMPTS", 2)
    monkeypatch.setattr(service, "CONNECT_WAIT_S", 0.05)
    records: list[dict[str, Any]] = []

    class Log:
        def warning(self, event: str, **kw: Any) -> None:
            records.append({"event": event, **kw})

        info = error = warning

    with pytest.raises(Unavailable) as nats_exc:
        asyncio.run(service.connect_nats("nats://gateway:nats-secret@127.0.0.1:no-port", "t", Log()))
    with RedisServer(tmp_path / "redis") as rs:
        redis_url = f"redis://gateway:redis-secret@127.0.0.1:{rs.port}/0"
        with pytest.raises(Unavailable) as redis_exc:
            asyncio.run(service.connect_redis(redis_url, Log()))
        # The settings' credentials win over the URL's.
        async def as_admin() -> bool:
            client = await service.connect_redis(redis_url, Log(), user=access.ADMIN,
                                                 password=rs.credentials.redis[access.ADMIN])
            try:
                return bool(await client.ping())
            finally:
                await client.aclose()

        assert asyncio.run(as_admin())
    text = json.dumps(records) + str(nats_exc.value) + str(redis_exc.value)
    assert "nats-secret" not in text and "redis-secret" not in text
    assert {r["event"] for r in records} == {"nats.connect_failed", "redis.connect_failed"}
    assert all(":***@127.0.0.1" in r["url"] for r in records)


# ------------------------------------------------------------------ cox up


def _cox_up(tmp: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], list[str], int]:
    port = free_port()
    base = foreign_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cox", "up", "--port", str(port), "--runners", "1", "--token=auth-test-token",
         "--no-demo", *args], cwd=tmp, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:  # closed at cox up's end of output, not by the garbage collector
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 90
    while not any(line.startswith("ready:") for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("cox up was not ready:\n" + "\n".join(lines[-40:]))
        time.sleep(0.1)
    return proc, lines, port


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(60)


def _a_turn(port: int) -> None:
    with Api(f"http://127.0.0.1:{port}", "auth-test-token") as api:
        sid = api.create("demo")["id"]
        assert api.send(sid, "hello").status_code == 202
        assert api.wait_type(sid, "turn.end", timeout=30)["outcome"] == "completed"


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def _no_password(secrets: set[str], texts: list[str]) -> None:
    for text in texts:
        assert not [s for s in secrets if s in text], "a password in cox up's output or a log"


def test_cox_up_starts_servers_that_admit_only_its_services(tmp_path: Path,
                                                             stopped: list[subprocess.Popen[str]]) -> None:
    # Each service as a fresh interpreter (COX_UP_FORK=0), so /proc/<pid>/environ shows what it
    # was given (a fork's shows the fork server's); the fork path passes the same environment
    # (tests/fast/test_forkserver.py).
    proc, lines, port = _cox_up(tmp_path, {"COX_UP_FORK": "0"})
    stopped.append(proc)
    state = tmp_path / ".cox"
    creds_file = state / "credentials.json"
    assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((state / "nats" / "nats.conf").stat().st_mode) == 0o600
    creds = Credentials.load(creds_file)
    _a_turn(port)
    nats_port = int(next(x for x in (state / "nats" / "nats.conf").read_text().splitlines()
                         if x.startswith("listen:")).split(":")[-1].strip('"'))
    redis_port = next(json.loads(x)["url"] for x in lines if '"redis.started"' in x).rsplit(":", 1)[1].split("/")[0]

    async def anonymous() -> str:
        try:
            await Conn().open(f"nats://127.0.0.1:{nats_port}", None, None)
        except nats.errors.Error as exc:
            return str(exc)
        return "connected"

    assert "Authorization Violation" in asyncio.run(anonymous())
    with redis.Redis(port=int(redis_port)) as anon, pytest.raises(redis.exceptions.AuthenticationError):
        anon.ping()
    with redis.Redis(port=int(redis_port), username=access.ADMIN, password=creds.redis[access.ADMIN]) as admin:
        assert admin.ping()
    # Each service was given only its own user.
    for child in psutil.Process(proc.pid).children():
        env = child.environ()
        inst = env.get("COX_INSTANCE", "")
        if not inst:
            continue
        svc = "turn-runner" if inst.startswith("turn-runner") else inst
        assert env["COX_NATS_USER"] == svc and env["COX_NATS_PASSWORD"] == creds.nats[svc]
        assert env.get("COX_REDIS_USER") == (svc if svc in access.REDIS_USERS else None)
    _stop(proc)
    _no_password(creds.passwords(), ["\n".join(lines)] + [p.read_text() for p in (state / "logs").glob("*.log")])


def test_cox_up_on_servers_of_ones_own(tmp_path: Path, stopped: list[subprocess.Popen[str]]) -> None:
    """NATS_URL/REDIS_URL: per-service users from --credentials; or one user, from the URL's
    user:pass@ (NATS here) or the variables (Redis here). Either way no password is logged."""
    creds = Credentials.generate()
    with NatsServer(tmp_path / "nats", credentials=creds) as ns, RedisServer(tmp_path / "redis", credentials=creds) as rs:
        creds.save(tmp_path / "creds.json")
        per_service = tmp_path / "per-service"
        per_service.mkdir()
        proc, lines, port = _cox_up(per_service, {"NATS_URL": ns.url, "REDIS_URL": rs.url, "COX_UP_FORK": "0"},
                                    "--credentials", str(tmp_path / "creds.json"))
        stopped.append(proc)
        users = {c.environ().get("COX_NATS_USER") for c in psutil.Process(proc.pid).children()}
        assert users == set(subjects.SERVICES)
        _a_turn(port)
        _stop(proc)
        _no_password(creds.passwords(), ["\n".join(lines)]
                     + [p.read_text() for p in (per_service / ".cox" / "logs").glob("*.log")])
        assert not (per_service / ".cox" / "credentials.json").exists(), "it started no server of its own"

        one_user = tmp_path / "one-user"
        one_user.mkdir()
        proc, lines, port = _cox_up(one_user, {"NATS_URL": ns.admin_url, "REDIS_URL": rs.url,
                                               "REDIS_USER": access.ADMIN,
                                               "REDIS_PASSWORD": creds.redis[access.ADMIN]})
        stopped.append(proc)
        _a_turn(port)
        _stop(proc)
        _no_password(creds.passwords(), ["\n".join(lines)]
                     + [p.read_text() for p in (one_user / ".cox" / "logs").glob("*.log")])
