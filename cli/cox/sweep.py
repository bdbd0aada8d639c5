"""``cox sweep TASKS.jsonl --out RESULTS.jsonl``: run every task as an unattended run (on each of
``--models``), ``--parallel`` at a time, check each in its workspace, and write one result line per
(task, model). Resumable: the same command again skips what has a result and re-attaches to runs
still going, so no task runs twice on one model (``sweep_plan``: the journal, and the
``client_id`` that makes a POST sent again answer the run the first one made). Exit 0 once every task has a result (passed or not),
1 when the sweep stopped before (Ctrl-C, the gateway lost: the runs go on; run it again), 2 on a
usage error (a bad task file, an unknown model, no token, no gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from .chat_client import ApiError, ChatApi
from .run import (
    EXIT_COMPLETED,
    EXIT_OTHERWISE,
    EXIT_USAGE,
    OUTAGE_S,
    RETRIED,
    RUN_END,
    GatewayLost,
    add_confirm_args,
    add_gateway_args,
    connect,
    follow,
    retrying,
)
from .sweep_plan import (
    Appender,
    Key,
    SweepFileError,
    Unit,
    candidates,
    client_id,
    intent,
    journal_path,
    load_tasks,
    new_nonce,
    nonce_of,
    parse_models,
    plan,
    read_jsonl,
    reconcile,
    resume,
    started,
    sweep_line,
    sweep_tag,
)
from .sweep_report import Tally, View, result, summarize, summary_table

MAX_PARALLEL = 64
"""More runs at once than this would hold more event reads than a principal may
(``[gateway] max_streams_per_principal``, 100) beside the console's."""
RUNS_LIMIT = 10_000
"""The most runs ``GET /v1/runs`` lists, newest first: a run an unsure intent made is among the
newest (the principal's runs made since are at most the sweep's own, N at a time)."""
CHECK_TIMEOUT_S = 620.0
"""The HTTP wait for a check: the server kills the command at its ``timeout_s`` (300, at most 540)."""


def build_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("tasks", metavar="TASKS.jsonl",
                   help="one task per line: {id, prompt, template?, model?, check?, max_turns?}")
    p.add_argument("--out", required=True, metavar="RESULTS.jsonl", help="where the result lines go (appended)")
    p.add_argument("--parallel", type=int, default=4, metavar="N", help="runs at once (default 4)")
    p.add_argument("--models", default=None, metavar="a,b", help="run every task on each of these models")
    add_confirm_args(p)
    p.add_argument("--json", action="store_true", help="print result lines and a summary line as JSON on stdout")
    add_gateway_args(p)


def _fail(messages: list[str]) -> int:
    for m in messages:
        print(f"cox sweep: {m}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.parallel <= MAX_PARALLEL:
        return _fail([f"--parallel must be 1 to {MAX_PARALLEL}"])
    try:
        tasks = load_tasks(Path(args.tasks))
        models = parse_models(args.models)
    except SweepFileError as exc:
        return _fail(exc.messages)
    out = Path(args.out)
    if not out.parent.is_dir():
        return _fail([f"--out: no folder {out.parent}"])
    api = connect(args, "cox sweep")
    if api is None:
        return EXIT_USAGE
    checker = ChatApi(args.url, api.token, timeout=CHECK_TIMEOUT_S)
    # One sweep per results file: two would each start the tasks the other has not recorded yet.
    lock = open(journal_path(out), "a")  # held, locked, until the sweep ends
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _fail([f"another cox sweep is writing {out}; wait for it or stop it first"])
        sweep = Sweep(api, checker, out, args.confirm, args.parallel, args.json)
        return asyncio.run(sweep.main(tasks, models))
    finally:
        lock.close()


class Sweep:
    def __init__(self, api: ChatApi, checker: ChatApi, out: Path, confirm: str, parallel: int, as_json: bool) -> None:
        self.api, self.checker = api, checker
        self.out, self.confirm, self.parallel, self.as_json = out, confirm, parallel, as_json
        self.tag = sweep_tag(out)
        self.claimed: set[str] = set()
        # lines are never wrapped (a pipe would get them cut at 80 columns); the table gets room
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self.stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
        self.lost: str | None = None
        self.nonce = ""

    async def main(self, tasks: list[Any], models: list[str] | None) -> int:
        try:
            return await self._main(tasks, models)
        finally:
            await self.api.aclose()
            await self.checker.aclose()

    async def _main(self, tasks: list[Any], models: list[str] | None) -> int:
        try:
            offered = await self.api.call("GET", "/v1/models")
        except ApiError as exc:
            return _fail([f"the gateway at {self.api.url} did not answer: {exc}" if exc.status == 0 else str(exc)])
        try:
            units = plan(tasks, models, str(offered["default"]), offered["models"])
            journaled = read_jsonl(journal_path(self.out))
            state = resume(read_jsonl(self.out), journaled)
        except SweepFileError as exc:
            return _fail(exc.messages)
        keys = {u.key for u in units}
        before = [state.done[k] for k in state.done if k in keys]
        todo = [u for u in units if u.key not in state.done]
        self.claimed = state.claimed()
        unsure = {u: state.unsure[u.key] for u in todo if u.key in state.unsure}
        try:
            if unsure:
                state.attach.update(await self.find(unsure))
        except (GatewayLost, ApiError) as exc:
            return _fail([f"the gateway did not answer the look-up of runs in flight: {exc}"])
        self.claimed |= set(state.attach.values())
        if state.attach and not self.as_json:
            n = sum(1 for u in todo if u.key in state.attach)
            self.err.print(f"cox sweep: {len(before)} done, re-attaching to {n} runs, {len(todo) - n} to start")

        self.results, self.journal = Appender(self.out), Appender(journal_path(self.out))
        nonce = nonce_of(journaled)
        if nonce is None:
            nonce = new_nonce()
            self.journal.add(sweep_line(nonce))
        self.nonce = nonce
        self.view = View(self.err, len(units), before)
        gate = asyncio.Semaphore(self.parallel)
        # runs to re-attach to first: they are going already
        order = sorted(todo, key=lambda u: u.key not in state.attach)
        jobs = [asyncio.create_task(self.one(u, state.attach.get(u.key), gate)) for u in order]
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        waiter = asyncio.create_task(stopped.wait())
        try:
            pending: set[asyncio.Task[Any]] = set(jobs)
            while pending and not stopped.is_set() and self.lost is None:
                _, pending = await asyncio.wait(pending | {waiter}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(waiter)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for t in [*jobs, waiter]:
                t.cancel()
            for t in [*jobs, waiter]:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            self.view.close()
            self.results.close()
            self.journal.close()
        finished = read_jsonl(self.out)
        mine = [r for r in finished if (str(r["id"]), str(r["model"])) in keys]
        self.summary(mine)
        if len(mine) < len(units):
            why = f"lost the gateway ({self.lost})" if self.lost else "interrupted"
            self.err.print(f"cox sweep: {why}: {len(units) - len(mine)} of {len(units)} without a result; "
                           "their runs go on: run the same command again to re-attach")
            return EXIT_OTHERWISE
        return EXIT_COMPLETED

    def summary(self, results: list[dict[str, Any]]) -> None:
        rows = summarize(results)
        if self.as_json:
            print(json.dumps({"summary": [r.as_json() for r in rows]}), flush=True)
        elif rows:
            self.stdout.print(summary_table(rows, ascii_only=not self.stdout.is_terminal))

    # ---------------------------------------------------------------- one run

    async def one(self, unit: Unit, sid: str | None, gate: asyncio.Semaphore) -> None:
        try:
            async with gate:
                self.view.started()
                res = await self._one(unit, sid)
                self.results.add(res)
                self.view.finished(res)
                if self.as_json:
                    print(json.dumps(res, ensure_ascii=False), flush=True)
        except (GatewayLost, ApiError) as exc:
            self.lost = str(exc)

    async def _one(self, unit: Unit, sid: str | None) -> dict[str, Any]:
        if sid is None:
            made = await self.start(unit)
            if isinstance(made, dict):
                return made
            sid = made
        tally = Tally()
        async for ev in follow(self.api, sid):
            tally.add(ev)
            if ev.get("type") == RUN_END:
                break
        exit_code, error = None, None
        if unit.task.check:
            try:
                checked = await self.check(sid, unit.task.check)
            except ApiError as exc:
                if exc.status in RETRIED:
                    raise
                error = f"check: {exc.code}: {exc.detail}"
            else:
                exit_code = checked.get("exit_code")
                if exit_code is None:
                    error = "check: it could not run or timed out: " + str(checked.get("output", ""))[-300:]
        session = await retrying(lambda: self.api.session(sid))
        return result(unit.task.id, unit.model, sid, tally, session, exit_code, unit.task.check is not None, error)

    async def check(self, sid: str, command: str) -> dict[str, Any]:
        """``POST .../check``, again while the session is busy (a turn someone else began after the
        run's end) for up to :data:`run.OUTAGE_S`, and while the gateway is away."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OUTAGE_S
        while True:
            try:
                return dict(await retrying(partial(self.checker.call, "POST", self.api.s(sid, "/check"),
                                                   {"command": command})))
            except ApiError as exc:
                if exc.code != "busy" or loop.time() > deadline:
                    raise
            await asyncio.sleep(1.0)

    def body(self, unit: Unit) -> dict[str, Any]:
        body: dict[str, Any] = {"text": unit.task.prompt, "model": unit.model, "confirm": self.confirm,
                                "unattended": True, "client_id": client_id(self.nonce, unit)}
        if unit.task.template is not None:
            body["template"] = unit.task.template
        else:
            body["workspace"] = unit.workspace(self.tag)
        if unit.task.max_turns is not None:
            body["max_turns"] = unit.task.max_turns
        return body

    async def start(self, unit: Unit) -> str | dict[str, Any]:
        """Start the run of ``unit``: its session id, or its result when the server refuses it.
        The intent is on disk before the POST; a POST whose answer is lost is sent again with the
        same ``client_id``, which answers the run it made if it made one (200, ``replay``)."""
        at = int(time.time() * 1000)
        body = self.body(unit)
        self.journal.add(intent(unit, at, body["client_id"]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60.0
        pause = 0.5
        workspace: str | None = None
        while True:
            try:
                made = await self.api.call("POST", "/v1/runs", body)
                sid, workspace = str(made["session_id"]), made.get("workspace")
                break
            except ApiError as exc:
                if exc.status not in RETRIED:
                    return result(unit.task.id, unit.model, None, Tally(), None, None, unit.task.check is not None,
                                  error=f"{exc.code}: {exc.detail}")
                if loop.time() > deadline:
                    raise GatewayLost(str(exc)) from exc
            await asyncio.sleep(pause)
            pause = min(pause * 2, 4.0)
        self.claimed.add(sid)
        self.journal.add(started(unit, sid, workspace))
        return sid

    async def find(self, unsure: dict[Unit, int]) -> dict[Key, str]:
        """The sessions that unsure intents made (:func:`sweep_plan.reconcile`)."""
        page = await retrying(partial(self.api.call, "GET", "/v1/runs", params={"limit": RUNS_LIMIT}))
        sessions: list[dict[str, Any]] = page.get("runs", [])
        texts: dict[str, str | None] = {}
        for sid in candidates(unsure, sessions, self.claimed, self.tag):
            texts[sid] = await self.first_text(sid)
        return reconcile(unsure, sessions, texts, self.claimed, self.confirm, self.tag)

    async def first_text(self, sid: str) -> str | None:
        batch = await retrying(lambda: self.api.call("GET", self.api.s(sid, "/events"),
                                                     params={"format": "json", "after": 0, "limit": 50}))
        for ev in batch or []:
            if ev.get("type") == "user.msg":
                return str(ev.get("text"))
        return None
