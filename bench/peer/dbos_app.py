# dbos is installed in the peer's venv only: to the project's mypy its decorators are untyped.
# mypy: disable-error-code="untyped-decorator"
"""The peer's app (DBOS Transact behind FastAPI), copied into its own project folder and served there.

Equivalent to the coxswain script the bench sends and to ``lg_graph.py``: a durable workflow of
``target`` tool steps of 5 ms each and no LLM. Its first step returns the run's start and its last
the run's end (``time.time()``, the same clock as the bench and Redis); both are checkpointed in
the workflow's output, which the read route returns. The POST answers the run's enqueue time
(``time.time()`` just before the enqueue): DBOS's own ``created_at`` has whole seconds on SQLite
under Python < 3.12.

Per-session order is DBOS's own: one queue partitioned by session id with a concurrency of 1 per
partition (``DBOS.register_queue(..., partition_concurrency=1)`` and
``SetEnqueueOptions(queue_partition_key=sid)``, DBOS 3.4), which starts a partition's head by
``priority``, then ``created_at``, then workflow id. Workflow ids are ``<sid>-<sequence>`` so
two runs enqueued within the same ``created_at`` keep their order: with DBOS's own (random) ids,
runs a session enqueued within one second started in random order here (SQLite, Python 3.11).

Routes (127.0.0.1 only):

- ``POST /sessions/{sid}/runs`` ``{"marker", "target", "mode"}``: ``queue`` enqueues behind the
  session's runs; ``interrupt`` cancels the session's running workflow (``DBOS.cancel_workflow``)
  and enqueues the new run ahead of any queued one (priority 1 against 2).
- ``GET /sessions/{sid}/runs[?steps=1]``: the session's runs with their times, in enqueue order;
  with ``steps=1`` also when each step's checkpoint was written.
- ``GET /runs/{wid}/join``: until the run has ended, then its status: the bench's wait, as
  LangGraph's ``join``. The workflow's last act wakes it in memory (instrumentation, outside DBOS),
  then DBOS's ``get_result`` reads the recorded outcome: waiting costs the server nothing, where
  ``get_result`` alone polls the database.
- ``GET /ok``: 200 once the queue's worker thread polls.

Configuration from the environment: ``DBOS_BENCH_DB`` (the SQLite file), ``DBOS_BENCH_PORT``,
``DBOS_BENCH_POLL_S`` (the queue's polling interval; DBOS's default is 1 s). Offline: no
conductor key, OTLP off.
"""

import asyncio
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from dbos import DBOS, DBOSConfig, SetEnqueueOptions, SetWorkflowID
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

TOOL_S = 0.005
QUEUE = "runs"
QUEUED_PRIORITY, AHEAD_PRIORITY = 2, 1
"""DBOS's unset priority (0) runs before every set one, and 1 is the smallest one can set: so
queued runs take 2 and an interrupting run 1."""
SEQ = itertools.count()
ENDED: dict[str, asyncio.Event] = {}
"""Runs that ended (or are waited for) by workflow id, on the app's loop: the bench's join only."""
app_loop: asyncio.AbstractEventLoop | None = None


def _ended(wid: str) -> asyncio.Event:
    return ENDED.setdefault(wid, asyncio.Event())


def _end(wid: str) -> None:
    _ended(wid).set()


@DBOS.step()
async def mark() -> float:
    return time.time()


@DBOS.step()
async def tool() -> None:
    await asyncio.sleep(TOOL_S)


@DBOS.workflow()
async def agent_run(marker: str, target: int) -> dict[str, Any]:
    start = await mark()
    for _ in range(target):
        await tool()
    end = await mark()
    if app_loop is not None:
        app_loop.call_soon_threadsafe(_end, str(DBOS.workflow_id))
    return {"marker": marker, "start": start, "end": end}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    global app_loop
    app_loop = asyncio.get_running_loop()
    DBOS.launch()
    await DBOS.register_queue_async(QUEUE, partition_concurrency=1,
                                    polling_interval_sec=float(os.environ.get("DBOS_BENCH_POLL_S", "1.0")),
                                    on_conflict="always_update")
    try:
        yield
    finally:
        DBOS.destroy()


app = FastAPI(lifespan=lifespan)
config: DBOSConfig = {
    "name": "cox-bench-peer",
    "system_database_url": f"sqlite:///{os.environ.get('DBOS_BENCH_DB', 'dbos.sqlite')}",
    "enable_otlp": False,
}
DBOS(config=config)


class Run(BaseModel):
    marker: str
    target: int = 3
    mode: str = "queue"


@app.get("/ok")
async def ok() -> dict[str, bool]:
    if not any(t.name == f"queue-worker-{QUEUE}" for t in threading.enumerate()):
        raise HTTPException(503, "the queue's worker has not started")
    return {"ok": True}


@app.post("/sessions/{sid}/runs")
async def post_run(sid: str, run: Run) -> dict[str, Any]:
    if run.mode not in ("queue", "interrupt"):
        raise HTTPException(422, f"mode {run.mode!r} is neither queue nor interrupt")
    priority = QUEUED_PRIORITY
    if run.mode == "interrupt":
        priority = AHEAD_PRIORITY
        running = await DBOS.list_workflows_async(workflow_id_prefix=f"{sid}-", status="PENDING",
                                                  load_input=False, load_output=False)
        for w in running:
            await DBOS.cancel_workflow_async(w.workflow_id)
    wid = f"{sid}-{next(SEQ):012d}"
    enqueued_at = time.time()
    with SetWorkflowID(wid), SetEnqueueOptions(queue_partition_key=sid, priority=priority):
        await DBOS.enqueue_workflow_async(QUEUE, agent_run, run.marker, run.target)
    return {"workflow_id": wid, "enqueued_at": enqueued_at}


@app.get("/runs/{wid}/join")
async def join(wid: str, timeout: float = 120.0) -> dict[str, Any]:
    try:
        await asyncio.wait_for(_ended(wid).wait(), timeout)
    finally:
        ENDED.pop(wid, None)
    handle = await DBOS.retrieve_workflow_async(wid)
    await handle.get_result(polling_interval_sec=0.005)
    return {"workflow_id": wid, "status": (await handle.get_status()).status}


@app.get("/sessions/{sid}/runs")
async def get_runs(sid: str, steps: int = 0) -> list[dict[str, Any]]:
    out = []
    for w in await DBOS.list_workflows_async(workflow_id_prefix=f"{sid}-"):
        res = w.output if isinstance(w.output, dict) else {}
        args = (w.input or {}).get("args") or [None]
        row = {"workflow_id": w.workflow_id, "status": w.status, "marker": args[0],
               "created_at": (w.created_at or 0) / 1000, "start": res.get("start"), "end": res.get("end")}
        if steps:
            row["steps"] = [(s["completed_at_epoch_ms"] or 0) / 1000
                            for s in await DBOS.list_workflow_steps_async(w.workflow_id, load_output=False)]
        out.append(row)
    return sorted(out, key=lambda r: r["workflow_id"])


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["DBOS_BENCH_PORT"]), access_log=False,
                log_level="warning")
