"""``cox chat [SID]``: a full-screen terminal client of the v1 API (Textual).

The transcript streams while you type. Enter sends; while a turn runs a plain send is refused
and you choose: Ctrl+O queue, Ctrl+S steer, Ctrl+L Lead (join this turn); Esc stops. Approvals
are answered inline (``/allow [message]``, ``/deny [message]``, ``/always``, or Ctrl+Y / Ctrl+N
with the typed text as the message). ``/undo``, ``/versions PATH``, ``/diff VID``,
``/restore VID``, ``/title NEW``, ``/model NAME``, ``/dontask on|off``, ``/attach PATH``, ``/help``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def build_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("sid", nargs="?", help="the session to open (default: a new session)")
    p.add_argument("--url", default=os.environ.get("COX_URL", "http://127.0.0.1:8765"),
                   help="the gateway (default $COX_URL or http://127.0.0.1:8765)")
    p.add_argument("--token", default=None, help="API token (default $COX_TOKEN, else .cox/token)")
    p.add_argument("--workspace", default="demo", help="workspace of a new session (default demo)")
    p.add_argument("--model", default=None, help="model of a new session (default: the server's)")
    p.add_argument("--state", default=".cox", help="where cox up keeps the token (default .cox)")


def resolve_token(args: argparse.Namespace) -> str | None:
    if args.token:
        return str(args.token)
    if os.environ.get("COX_TOKEN"):
        return os.environ["COX_TOKEN"]
    path = Path(args.state) / "token"
    if path.is_file():
        return path.read_text().strip() or None
    return None


def run(args: argparse.Namespace) -> int:
    token = resolve_token(args)
    if not token:
        print("cox chat: no token: pass --token, set COX_TOKEN, or run where cox up keeps .cox/token", file=sys.stderr)
        return 2
    from .chat_app import ChatApp  # Textual loads only when the chat runs
    from .chat_client import ChatApi

    app = ChatApp(ChatApi(args.url, token), args.sid, args.workspace, args.model)
    return app.run() or 0
