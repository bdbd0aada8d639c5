"""``cox run TEXT``: start a run (``POST /v1/runs``), stream a compact transcript of it, and exit
0 when it completes, 1 when it ended otherwise, 2 on a usage or connection error.

A run is the server's: it drives turns until the model is done, ``--max-turns`` turns have run,
or it is stopped (docs/api.md, "Runs"). This client only starts it and reads its log with JSON
long polls (``GET /v1/sessions/{sid}/events?format=json&after=SEQ&wait=S``), which resume by
``seq`` after a lost connection, so nothing is shown twice or skipped. Ctrl-C asks the server to
stop the run (``POST /v1/sessions/{sid}/stop``) and waits for its ``run.end``; a second Ctrl-C
leaves at once (the run is stopped already, or the stop is on its way).

:func:`follow` and :func:`connect` are shared with ``cox sweep``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, TextIO

from .chat import resolve_token
from .chat_client import ApiError, ChatApi

Event = dict[str, Any]
RUN_START, RUN_END = "run.start", "run.end"
COMPLETED = "completed"
EXIT_COMPLETED, EXIT_OTHERWISE, EXIT_USAGE = 0, 1, 2
POLL_S = 20.0
"""How long one JSON long poll waits for the next event (the server allows up to 60)."""
OUTAGE_S = 60.0
"""How long a reader keeps retrying a gateway that does not answer before it gives up."""
STOP_WAIT_S = 30.0
"""After Ctrl-C, how long ``cox run`` waits for the stopped run's ``run.end``."""
RETRIED = frozenset({0, 429, 502, 503, 504})
"""Statuses a read retries: no answer (0), too many streams, the gateway or its servers away."""


class GatewayLost(Exception):
    """The gateway did not answer for :data:`OUTAGE_S`: the run goes on, its reader gave up."""


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    """``--url``, ``--token`` and ``--state``, as ``cox chat`` takes them."""
    p.add_argument("--url", default=os.environ.get("COX_URL", "http://127.0.0.1:8765"),
                   help="the gateway (default $COX_URL or http://127.0.0.1:8765)")
    p.add_argument("--token", default=None, help="API token (default $COX_TOKEN, else .cox/token)")
    p.add_argument("--state", default=".cox", help="where cox up keeps the token (default .cox)")


def add_confirm_args(p: argparse.ArgumentParser) -> None:
    """``--judge | --yolo``: who answers approvals (default the person)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--judge", dest="confirm", action="store_const", const="judge",
                   help="the judge answers what would go to the person")
    g.add_argument("--yolo", dest="confirm", action="store_const", const="yolo",
                   help="every tool call policy allows runs without asking")
    p.set_defaults(confirm="person")


def build_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="what the run is to do; - reads it from stdin")
    p.add_argument("--workspace", default=None, help="the run's workspace (default: the server's)")
    p.add_argument("--model", default=None, help="the model (default: the server's)")
    add_confirm_args(p)
    p.add_argument("--unattended", action="store_true",
                   help="nobody is there: what would ask the person is refused instead of waiting")
    p.add_argument("--max-turns", type=int, default=None, metavar="N",
                   help="end the run after N turns (default: the server's, 10)")
    p.add_argument("--json", action="store_true",
                   help="print the run's events as JSON lines (all but assistant.delta)")
    add_gateway_args(p)


def connect(args: argparse.Namespace, prog: str) -> ChatApi | None:
    """The API client for ``--url`` and the token, or None after saying why on stderr."""
    token = resolve_token(args)
    if not token:
        print(f"{prog}: no token: pass --token, set COX_TOKEN, or run where cox up keeps .cox/token",
              file=sys.stderr)
        return None
    return ChatApi(args.url, token)


async def retrying(what: Callable[[], Any], outage_s: float = OUTAGE_S) -> Any:
    """``await what()``, again with backoff while the gateway is away (:data:`RETRIED`), for at
    most ``outage_s``; only for calls that are safe to repeat (reads, stop, a check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + outage_s
    pause = 0.25
    while True:
        try:
            return await what()
        except ApiError as exc:
            if exc.status not in RETRIED or loop.time() + pause > deadline:
                if exc.status in RETRIED:
                    raise GatewayLost(str(exc)) from exc
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 4.0)


async def follow(api: ChatApi, sid: str, after: int = 0, poll_s: float = POLL_S) -> AsyncIterator[Event]:
    """Every event of ``sid`` after ``after``, in seq order, each once, until the caller stops
    iterating (it ends at nothing by itself: a run's reader stops at ``run.end``)."""
    last = after
    while True:
        params = {"format": "json", "after": last, "wait": poll_s, "limit": 1000}
        batch = await retrying(partial(api.call, "GET", api.s(sid, "/events"), params=params))
        for ev in batch or []:
            seq = int(ev.get("seq", 0))
            if seq <= last:
                continue
            last = seq
            yield ev


def exit_code(outcome: object) -> int:
    return EXIT_COMPLETED if outcome == COMPLETED else EXIT_OTHERWISE


# ---------------------------------------------------------------- the compact transcript

def _clip(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines() or [""]
    more = len(lines) - 1
    return _clip(lines[0]) + (f"  (+{more} lines)" if more else "")


def _call(name: str, args: Any) -> str:
    a = args if isinstance(args, dict) else {}
    if name == "run_command" and isinstance(a.get("command"), str):
        return "$ " + _clip(a["command"])
    if isinstance(a.get("path"), str) and name in ("read_file", "write_file", "edit_file", "list_dir"):
        return f"{name} {a['path']}"
    return f"{name} {_clip(json.dumps(args, ensure_ascii=False), 80)}"


def _script_free(text: str) -> str:
    """A message without its ``script`` block (the script model's steps are not the point)."""
    head, sep, _ = text.partition("```script")
    return head.strip() or ("(a script)" if sep else "")


class Transcript:
    """A run's events as short lines for a person: what was asked, what the model said and did,
    what policy refused, and how each turn and the run ended. Streamed deltas are skipped: each
    response is shown once, whole, with its ``assistant.msg``."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.calls: dict[str, str] = {}

    def line(self, ev: Event) -> str | None:
        t = ev.get("type")
        if t == RUN_START:
            turns = ev.get("max_turns")
            return (f"run {ev.get('sid')}: confirm {ev.get('confirm')}"
                    f"{', unattended' if ev.get('unattended') else ''}, at most {turns} turns")
        if t == "user.msg":
            return "> " + _first_line(_script_free(str(ev.get("text", ""))))
        if t == "assistant.msg" and str(ev.get("text") or "").strip():
            return "\n".join("  " + ln for ln in str(ev["text"]).strip().splitlines())
        if t == "agent.message":
            return "  " + _first_line(str(ev.get("text", "")))
        if t == "tool.call":
            self.calls[str(ev.get("call_id"))] = str(ev.get("name"))
            return "  " + _call(str(ev.get("name")), ev.get("args"))
        if t == "tool.result":
            mark = "ok" if ev.get("ok") else "failed"
            output = str(ev.get("output") or "")
            return f"    {mark}: {_first_line(output)}" if output.strip() else f"    {mark}"
        if t == "tool.skipped":
            return f"    skipped ({ev.get('reason')})"
        if t == "policy.decision" and ev.get("verdict") == "refuse":
            return f"    refused by {ev.get('actor')}: {_clip(str(ev.get('reason') or ''))}"
        if t == "approval.pending":
            return (f"  ? approval {ev.get('approval_id')} for {_call(str(ev.get('name')), ev.get('args'))}:"
                    f" answer it in the console or with cox chat {ev.get('sid')}")
        if t == "approval.resolved":
            return f"    {ev.get('decision')} by {ev.get('actor')}"
        if t == "limit.hard":
            return f"  limit {ev.get('limit')} reached ({ev.get('value')})"
        if t == "model.retry":
            return f"  model retry {ev.get('attempt')} in {ev.get('delay_s')} s: {_clip(str(ev.get('error')), 80)}"
        if t == "turn.end":
            detail = f": {_clip(str(ev['detail']), 80)}" if ev.get("detail") else ""
            return f"turn ended {ev.get('outcome')}{detail}"
        if t == RUN_END:
            n = ev.get("turns")
            return f"run ended {ev.get('outcome')} after {n} turn{'' if n == 1 else 's'}"
        return None

    def show(self, ev: Event) -> None:
        text = self.line(ev)
        if text is not None:
            print(text, file=self.out, flush=True)


def show_json(ev: Event, out: TextIO) -> None:
    if ev.get("type") != "assistant.delta":
        print(json.dumps(ev, ensure_ascii=False, separators=(",", ":")), file=out, flush=True)


# ---------------------------------------------------------------- the command

def read_text(arg: str) -> str:
    return sys.stdin.read() if arg == "-" else arg


def run_body(args: argparse.Namespace, text: str) -> dict[str, Any]:
    body: dict[str, Any] = {"text": text, "confirm": args.confirm, "unattended": bool(args.unattended)}
    if args.workspace:
        body["workspace"] = args.workspace
    if args.model:
        body["model"] = args.model
    if args.max_turns is not None:
        body["max_turns"] = args.max_turns
    return body


def run(args: argparse.Namespace) -> int:
    if args.max_turns is not None and args.max_turns < 1:
        print("cox run: --max-turns must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    text = read_text(args.text)
    if not text.strip():
        print("cox run: the text is empty", file=sys.stderr)
        return EXIT_USAGE
    api = connect(args, "cox run")
    if api is None:
        return EXIT_USAGE
    return asyncio.run(_main(api, run_body(args, text), args.json))


async def _main(api: ChatApi, body: dict[str, Any], as_json: bool) -> int:
    try:
        return await _drive(api, body, as_json)
    finally:
        await api.aclose()


async def _drive(api: ChatApi, body: dict[str, Any], as_json: bool) -> int:
    # Ctrl-C is ours from before the POST: asyncio.run's own handling would cancel the main task
    # mid-request, killing the client with a traceback while the run it asked for goes on
    loop = asyncio.get_running_loop()
    interrupts = asyncio.Queue[None]()
    loop.add_signal_handler(signal.SIGINT, interrupts.put_nowait, None)
    try:
        started = await _start(api, body, interrupts)
        if isinstance(started, int):
            return started
        return await _follow_run(api, str(started["session_id"]), started, as_json, interrupts)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _start(api: ChatApi, body: dict[str, Any], interrupts: asyncio.Queue[None]) -> dict[str, Any] | int:
    """The POST's answer, or an exit code. A Ctrl-C while the POST is in flight is kept in
    ``interrupts`` for the run to be stopped once its id is known; a second leaves at once."""
    post = asyncio.ensure_future(api.call("POST", "/v1/runs", body))
    ctrl_c = asyncio.ensure_future(interrupts.get())
    pressed = 0
    try:
        while not post.done():
            await asyncio.wait({post, ctrl_c}, return_when=asyncio.FIRST_COMPLETED)
            if ctrl_c.done():
                pressed += 1
                if pressed > 1:
                    print("cox run: left before the gateway answered; the run may have started "
                          "(GET /v1/sessions lists it)", file=sys.stderr)
                    return EXIT_OTHERWISE
                print("cox run: the run is stopped as soon as the gateway answers (Ctrl-C again to leave at once)",
                      file=sys.stderr, flush=True)
                ctrl_c = asyncio.ensure_future(interrupts.get())
    finally:
        for t in (post, ctrl_c):
            t.cancel()
            with contextlib.suppress(BaseException):  # its end was handled, or does not matter now
                await t
    try:
        started: dict[str, Any] = post.result()
    except ApiError as exc:
        where = "the gateway did not answer" if exc.status == 0 else f"{exc.status} {exc.code}"
        print(f"cox run: {where}: {exc.detail}", file=sys.stderr)
        return EXIT_USAGE
    if pressed:
        interrupts.put_nowait(None)  # stopped as a Ctrl-C after the start is
    return started


async def _follow_run(api: ChatApi, sid: str, started: dict[str, Any], as_json: bool,
                      interrupts: asyncio.Queue[None]) -> int:
    transcript = Transcript(sys.stdout)
    show = (lambda ev: show_json(ev, sys.stdout)) if as_json else transcript.show
    if not as_json:
        print(f"session {sid} in {started.get('workspace')}", file=sys.stderr, flush=True)

    loop = asyncio.get_running_loop()
    reader = asyncio.ensure_future(_until_end(api, sid, show))
    stopper: asyncio.Task[Any] | None = None
    try:
        while True:
            ctrl_c = asyncio.ensure_future(interrupts.get())
            done, _ = await asyncio.wait({reader, ctrl_c}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                ctrl_c.cancel()
                return _ended(reader, sid)
            if stopper is not None:
                print("cox run: left without waiting; the run is being stopped", file=sys.stderr)
                return EXIT_OTHERWISE
            print("cox run: stopping the run (Ctrl-C again to leave at once)", file=sys.stderr, flush=True)
            stopper = asyncio.ensure_future(retrying(lambda: api.stop(sid)))
            loop.call_later(STOP_WAIT_S, reader.cancel)
    finally:
        for t in (reader, stopper):
            if t is not None:
                t.cancel()
                with contextlib.suppress(BaseException):  # its end was handled, or does not matter now
                    await t


def _ended(reader: asyncio.Task[Any], sid: str) -> int:
    if reader.cancelled():
        print(f"cox run: no run.end within {STOP_WAIT_S:.0f} s of the stop; see the log of {sid}", file=sys.stderr)
        return EXIT_OTHERWISE
    exc = reader.exception()
    if isinstance(exc, GatewayLost | ApiError):
        print(f"cox run: lost the gateway ({exc}); the run {sid} goes on without this reader", file=sys.stderr)
        return EXIT_USAGE
    if exc is not None:
        raise exc
    return exit_code(reader.result())


async def _until_end(api: ChatApi, sid: str, show: Callable[[Event], None]) -> object:
    """Show the run's events up to its ``run.end``; its outcome."""
    async for ev in follow(api, sid):
        show(ev)
        if ev.get("type") == RUN_END:
            return ev.get("outcome")
    return None
