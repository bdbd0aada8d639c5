"""The container tier: the compose file on a real Docker engine, on the images ``./dev images``
builds here (no registry is reachable). One project is brought up and driven through the
gateway's published port: a turn with a write and a confined command, three runners and one
killed mid-turn, Redis and NATS restarted under queued work, and ``down -v`` leaving nothing.
The README's compose section is run word for word in a project of its own.

Skipped, saying why, where no engine answers or no Compose is installed (``./dev test`` prints
the reason); ``COX_TEST_DOCKER=1`` makes that a failure instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.checks import seqs_rise
from tests.support.compose import ROOT, Compose, compose_command, leftovers, local_images, project_dir
from tests.support.containers import engine_problem
from tests.support.flow import result, run_allowing
from tests.support.stack import Api, script, tool


def _why_not() -> str:
    problem = engine_problem().split(" (./dev images")[0]
    if problem.startswith("image "):
        problem = ""  # the images are built by the tier itself
    if not problem and not compose_command():
        problem = "neither `docker compose` nor `docker-compose` is installed"
    return problem


WHY_NOT = _why_not()
if WHY_NOT and os.environ.get("COX_TEST_DOCKER") == "1":
    raise RuntimeError(f"COX_TEST_DOCKER=1 but {WHY_NOT}")
pytestmark = [pytest.mark.containers, pytest.mark.skipif(bool(WHY_NOT), reason=f"container tier: {WHY_NOT}")]


@pytest.fixture(scope="module")
def cx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compose]:
    c = Compose(tmp_path_factory.mktemp("compose"))
    try:
        c.up()
        yield c
    finally:
        c.down()


@pytest.fixture
def api(cx: Compose) -> Iterator[Api]:
    with Api(cx.url, cx.token, timeout=30) as client:
        yield client


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=120)


def test_a_turn_writes_and_runs_a_command_confined_in_the_runner_container(cx: Compose, api: Api) -> None:
    s = api.create("box")
    sid, ws = s["id"], s["workspace"]
    probe = ("cat note.txt; hostname; ls /app 2>&1; ls /proc | wc -l; cat /proc/1/environ 2>&1 | head -c 200; "
             "echo escaped > /tmp/escape.txt; "
             "python3 -c \"import socket; socket.create_connection(('nats', 4222), 3)\" 2>&1 | tail -1; "
             "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8765), 3)\" 2>&1 | tail -1")
    evs = run_allowing(api, sid, script(
        {"text": "Writing.", "tools": [tool("write_file", path="note.txt", content="written in a container\n")]},
        {"text": "Running.", "tools": [tool("run_command", command=probe)]},
        {"text": "Done."}))
    assert [e["outcome"] for e in evs if e["type"] == "turn.end"] == ["completed"], evs[-3:]
    run_id = next(e["call_id"] for e in evs if e["type"] == "tool.call" and e["name"] == "run_command")
    out = result(evs, run_id)["output"]
    lines = out.splitlines()
    assert lines[0] == "exit code 0", out
    lines = lines[1:]
    assert lines[0] == "written in a container", out
    assert lines[1] == "sandbox", out                       # its own uts namespace
    assert "/app" in lines[2] and "No such file" in lines[2], out   # the runner's code is not there
    assert lines[3].strip() == "0", out                      # an empty /proc: no process of the runner
    assert "TURN_RUNNER" not in out and "PASSWORD" not in out, out  # nor its environment (passwords)
    assert "gaierror" in lines[-2] and "ConnectionRefusedError" in lines[-1], out  # no network at all
    (runner,) = cx.running("turn-runner")
    # The write is in the workspace volume the runner sees; the command's /tmp was its own.
    assert docker("exec", runner, "cat", f"{ws}/note.txt").stdout == "written in a container\n"
    assert docker("exec", runner, "test", "-e", "/tmp/escape.txt", check=False).returncode == 1
    health = api.http.get("/healthz").json()
    box = health["services"]["turn-runner"]["detail"]["sandbox"]
    assert {k: box[k] for k in ("mode", "available")} == {"mode": "bwrap", "available": True}, health
    # the engine delegates no cgroup to the container: the rlimits alone bound a command, and say so
    assert box["limits"]["cgroups"] == "off" and box["limits"]["max_processes"] == 1024, health


def holder(cx: Compose, sid: str, timeout: float = 20.0) -> str:
    """The runner container whose log says it began a turn of ``sid``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in cx.running("turn-runner"):
            log = cx.logs_of(c)
            if f'"sid": "{sid}"' in log and '"event": "turn.begin"' in log:
                return c
        time.sleep(0.2)
    raise AssertionError(f"no runner container logged a turn of {sid}")


def turns(evs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(the message_id each turn ran, its outcome), in the order the turns ended."""
    out = []
    start: dict[str, Any] = {}
    for e in evs:
        if e["type"] == "turn.start":
            start = e
        elif e["type"] == "turn.end":
            out.append((str(start.get("message_id")), e["outcome"]))
    return out


def sent(api: Api, sid: str, text: str, mode: str | None = None) -> str:
    r = api.send(sid, text, mode=mode)
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def test_three_runners_one_killed_mid_turn_is_taken_over(cx: Compose, api: Api) -> None:
    cx.up("--scale", "turn-runner=3")
    deadline = time.monotonic() + 60
    while len(cx.running("turn-runner")) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(cx.running("turn-runner")) == 3
    sid = api.create("takeover")["id"]
    ids = [sent(api, sid, script({"delay_ms": 120_000, "text": "never"}, text="slow"))]
    ids += [sent(api, sid, script({"text": f"{label} done"}, text=label), mode="queue") for label in ("q1", "q2")]
    victim = holder(cx, sid)
    killed_at = time.monotonic()
    docker("kill", victim)
    end = api.wait_type(sid, "turn.end", timeout=30)
    took = time.monotonic() - killed_at
    assert end["outcome"] == "crashed", end
    api.wait_for(sid, lambda e: e["type"] == "turn.end" and e["seq"] > end["seq"] and not api.session(sid)["busy"]
                 and not api.session(sid)["queue"], timeout=60, after=end["seq"])
    evs = api.all_events(sid)
    seqs_rise(evs)
    assert turns(evs) == [(ids[0], "crashed"), (ids[1], "completed"), (ids[2], "completed")], turns(evs)
    print(f"compose takeover: docker kill -> crashed in {took:.1f} s")


def test_redis_and_nats_restarted_nothing_answered_202_is_lost(cx: Compose, api: Api) -> None:
    sid = api.create("restarts")["id"]
    accepted = []
    for i in range(6):
        steps = [{"delay_ms": 3000, "text": "first"}] if i == 0 else []
        accepted.append(sent(api, sid, script(*steps, {"text": f"m{i} done"}, text=f"m{i}"),
                             mode=None if i == 0 else "queue"))
    cx.run("restart", "redis", "nats", timeout=120)
    cx.wait_healthy()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            done = turns(api.all_events(sid))
        except AssertionError:  # 503 while a server comes back
            time.sleep(0.5)
            continue
        if len(done) == len(accepted):
            break
        time.sleep(0.5)
    evs = api.all_events(sid)
    seqs_rise(evs)
    got = turns(evs)
    assert [t for t, _ in got] == accepted, got
    # The first may have been cut by the restart (ended crashed by the takeover); the rest ran.
    assert all(o == "completed" for _, o in got[1:]), got
    assert got[0][1] in ("completed", "crashed"), got


def test_down_v_leaves_nothing_behind(cx: Compose) -> None:
    assert any(leftovers(cx.project).values())
    cx.down()
    assert leftovers(cx.project) == {"containers": [], "networks": [], "volumes": []}


def readme_compose_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### docker compose\n"):]
    section = section[:section.index("\n## ")]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the compose section has one block of commands"
    return str(blocks[0])


def test_the_readme_compose_section_word_for_word(tmp_path: Path) -> None:
    block = readme_compose_block()
    d = project_dir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COX_")}
    env.update(local_images())  # the local images instead of the official ones (no registry here)
    env["COX_PORT"] = str(Compose.__init__.__globals__["free_port"]())
    shim = ""
    if compose_command() == ["docker-compose"]:
        # Only Compose v1 is installed here (Debian's docker-compose; no v2 in Debian or on PyPI):
        # the README's `docker compose` runs as `docker-compose`, the same commands.
        shim = 'docker() { if [ "$1" = compose ]; then shift; docker-compose "$@"; else command docker "$@"; fi; }\n'
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", shim + block], cwd=d, env=env, capture_output=True,
                           text=True, timeout=400)
    finally:
        after = leftovers(d.name)
        if any(after.values()):
            subprocess.run([*compose_command(), "down", "-v"], cwd=d, env=env, capture_output=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert '"id":' in r.stdout and '"workspace":' in r.stdout, r.stdout[-1500:]
    assert oct((d / ".env").stat().st_mode & 0o777) == "0o600"
    assert r.stdout.count("turn-runner") >= 4, r.stdout  # `ps` listed the four runners
    assert after == {"containers": [], "networks": [], "volumes": []}, after
