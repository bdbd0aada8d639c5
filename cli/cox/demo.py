"""The demo workspace and session ``cox up`` prepares, and the curl it prints."""

from __future__ import annotations

import json
import shlex
import urllib.request
from pathlib import Path

DEMO_README = """# demo

A folder the coxswain demo session works in. Try:

    curl ... /v1/sessions/<sid>/messages -d '{"text": "hello"}'
"""

SCRIPT = [
    {"text": "Looking around first.", "tools": [{"name": "list_dir", "args": {"path": "."}}]},
    {"tools": [{"name": "write_file", "args": {"path": "notes/hello.txt", "content": "Hello from coxswain.\n"}}]},
    {"tools": [{"name": "run_command", "args": {"command": "cat notes/hello.txt"}}]},
    {"text": "Done: I wrote notes/hello.txt and read it back."},
]


def prepare(base: str, token: str, root: Path) -> str | None:
    """Make ``<root>/demo`` on first run and a session in it; return the session id."""
    demo = root / "demo"
    if not demo.exists():
        demo.mkdir(parents=True)
        (demo / "README.md").write_text(DEMO_README)
    req = urllib.request.Request(
        base + "/v1/sessions", method="POST", data=json.dumps({"workspace": "demo"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return str(json.loads(r.read())["id"])
    except Exception:  # noqa: BLE001 - the demo is a convenience; cox up still runs
        return None


def instructions(base: str, token: str, sid: str) -> str:
    text = "Write a note, then read it back.\n```script\n" + json.dumps(SCRIPT) + "\n```"
    body = json.dumps({"text": text})
    auth = f"-H {shlex.quote('Authorization: Bearer ' + token)}"
    return (
        "demo session: " + sid + "\n"
        "run a scripted turn (paste this):\n"
        f"  curl -s -X POST {base}/v1/sessions/{sid}/messages {auth} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}\n"
        "then watch its events:\n"
        f"  curl -s '{base}/v1/sessions/{sid}/events?format=json&wait=5' {auth}\n"
        f"console: {base}/"
    )
