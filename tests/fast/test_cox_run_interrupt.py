"""Ctrl-C at ``cox run``'s every moment after it started: while ``POST /v1/runs`` is in flight,
and the instant its answer arrives. The gateway here is a stand-in HTTP server (this tests the
client's signal handling, not the server), holding the POST until the test lets it answer.

A CI run of tests/stack/test_cox_run.py sent SIGINT once the server had begun the run's turn,
which on a loaded machine can be before ``cox run`` has read the POST's answer. asyncio.run's
own SIGINT handling cancels the main task then: ``cox run`` died with a KeyboardInterrupt
traceback and left the run going (exit -2, no stop); and once it never exited at all (the
cancellation swallowed on the way, and the one Ctrl-C spent). A Ctrl-C there must stop the run
as one later does, and a second must leave at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

CLI = Path(__file__).resolve().parents[2] / "cli"
SID = "s_ctrl_c"


@dataclass
class Gateway:
    posted: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)
    stops: list[str] = field(default_factory=list)
    url: str = ""


def serve(gw: Gateway) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def reply(self, obj: Any, code: int = 200) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the client left

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path == "/v1/runs":
                gw.posted.set()
                gw.release.wait(20)
                self.reply({"session_id": SID, "workspace": "w", "run": {"state": "running"}}, 202)
                gw.answered.set()
            elif self.path == f"/v1/sessions/{SID}/stop":
                gw.stops.append(self.path)
                self.reply({"ok": True})
            else:
                self.reply({"error": "not_found", "detail": self.path}, 404)

        def do_GET(self) -> None:
            if gw.stops:
                self.reply([{"seq": 1, "sid": SID, "type": "run.end", "outcome": "stopped", "turns": 1}])
            else:
                time.sleep(0.2)
                self.reply([])

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    gw.url = f"http://127.0.0.1:{srv.server_address[1]}"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def gw() -> Iterator[Gateway]:
    g = Gateway()
    srv = serve(g)
    yield g
    g.release.set()
    srv.shutdown()
    srv.server_close()


def start(gw: Gateway) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COX_")}
    env["PYTHONPATH"] = str(CLI) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "cox", "run", "--url", gw.url, "--token", "t", "go"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)


def finish(p: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_ctrl_c_while_the_post_is_in_flight_stops_the_run_once_it_answers(gw: Gateway) -> None:
    p = start(gw)
    assert gw.posted.wait(20), "cox run never posted the run"
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)  # the interrupt is in before the answer
    gw.release.set()
    out, err = finish(p)
    assert "Traceback" not in err, err
    assert p.returncode == 1, err
    assert gw.stops == [f"/v1/sessions/{SID}/stop"], err
    assert out.splitlines()[-1].startswith("run ended stopped"), out
    assert "stopping the run" in err


def test_two_ctrl_c_while_the_post_is_in_flight_leave_at_once(gw: Gateway) -> None:
    p = start(gw)
    assert gw.posted.wait(20)
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = finish(p)  # the gateway still holds the POST: leaving must not wait for it
    assert "Traceback" not in err, err
    assert p.returncode == 1, err
    assert "may have started" in err, err
    assert "run ended" not in out, out


@pytest.mark.parametrize("lag_ms", [0, 1, 3, 10])
def test_ctrl_c_as_the_answer_arrives_stops_the_run(gw: Gateway, lag_ms: int) -> None:
    p = start(gw)
    assert gw.posted.wait(20)
    gw.release.set()
    assert gw.answered.wait(20)
    time.sleep(lag_ms / 1000)
    p.send_signal(signal.SIGINT)
    out, err = finish(p)
    assert "Traceback" not in err, err
    assert p.returncode == 1, err
    assert gw.stops == [f"/v1/sessions/{SID}/stop"], err
    assert out.splitlines()[-1].startswith("run ended stopped"), out
