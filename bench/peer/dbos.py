"""The peer DBOS Transact: durable workflows on SQLite, behind a minimal FastAPI + uvicorn app.

``--peer dbos`` installs ``dbos`` (3.4.x), ``fastapi`` and ``uvicorn[standard]`` into their own
venv (``bench/.peer-venv-dbos``, never the project's), copies ``dbos_app.py`` into a project
folder and runs it there with ``python dbos_app.py`` on 127.0.0.1, its system database a SQLite
file in that folder. Offline: no conductor key, OTLP off, nothing of the bench's ``DBOS*``
environment passed on.

- queue: a run is a workflow enqueued on one queue partitioned by session, one at a time per
  partition, against our ``mode=queue``.
- interrupt: the session's running workflow cancelled (``DBOS.cancel_workflow``) and the new one
  enqueued ahead, against our ``mode=steer``; no overlap means no step of the cancelled workflow
  checkpointed after the new one's first step.

The queue is polled: a queued workflow starts at the worker's next poll, every
``polling_interval_sec`` (DBOS's default 1 s; the bench's ``peer_dbos_poll_s``, 10 ms unless
``--set`` says otherwise, the setting DBOS names for lower latency at the price of more polling).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ..profiles import Counts
from .base import TIMEOUT_S, Driver, Peer, PeerServer, get_ok, post_ok

HERE = Path(__file__).resolve().parent


class Server(PeerServer):
    project = "dbos-project"
    env_drop = ("DBOS",)

    def __init__(self, tmp: Path, bin_dir: Path, c: Counts) -> None:
        super().__init__(tmp, bin_dir, c)
        self.poll_s = c.peer_dbos_poll_s
        shutil.copy(HERE / "dbos_app.py", self.dir / "dbos_app.py")

    def argv(self) -> list[str]:
        return [str(self.bin / "python"), "dbos_app.py"]

    def env(self) -> dict[str, str]:
        return {**super().env(), "DBOS_BENCH_PORT": str(self.port), "DBOS_BENCH_POLL_S": str(self.poll_s),
                "DBOS_BENCH_DB": str(self.dir / "dbos.sqlite")}

    def settings(self) -> dict[str, Any]:
        return {"queue_polling_interval_s": self.poll_s, "system_database": "sqlite", "python": sys.version.split()[0]}


class DbosDriver(Driver):
    async def session(self) -> str:
        return uuid.uuid4().hex  # a partition key: nothing to create

    async def post(self, sid: str, marker: str, target: int, mode: str) -> dict[str, Any]:
        return dict(await post_ok(self.pool, f"/sessions/{sid}/runs", {"marker": marker, "target": target,
                                                                        "mode": mode}))

    def created(self, run: dict[str, Any]) -> float:
        return float(run["enqueued_at"])

    async def _runs(self, sid: str, steps: bool = False) -> list[dict[str, Any]]:
        return list(await get_ok(self.pool, f"/sessions/{sid}/runs" + ("?steps=1" if steps else "")))

    async def wait_running(self, sid: str, run: dict[str, Any]) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if any(r["workflow_id"] == run["workflow_id"] and r["status"] == "PENDING" for r in await self._runs(sid)):
                await asyncio.sleep(0.05)  # well inside its tool steps
                return
            await asyncio.sleep(0.02)
        raise TimeoutError("the long run never started")

    async def join(self, last: dict[str, dict[str, Any]]) -> None:
        await asyncio.gather(*(get_ok(self.pool, f"/runs/{r['workflow_id']}/join") for r in last.values()))

    async def log(self, sid: str) -> list[dict[str, Any]]:
        return run_log(await self._runs(sid))

    async def interrupted(self, sid: str, old: dict[str, Any], new_start: float) -> list[str]:
        problems = []
        run = next(r for r in await self._runs(sid, steps=True) if r["workflow_id"] == old["workflow_id"])
        if run["status"] != "CANCELLED":
            problems.append(f"{sid}: the interrupted workflow ended {run['status']}")
        late = [t for t in run.get("steps") or [] if t > new_start]
        if late:
            problems.append(f"{sid}: {len(late)} steps of the interrupted workflow checkpointed after the new one started")
        return problems


def run_log(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session's run log from its workflows' first- and last-step times, in the order they
    happened. Both times are the workflow's output: one that did not finish is not in the log."""
    evs = [{"marker": r["marker"], "ev": ev, "t": r[ev]} for r in runs for ev in ("start", "end") if r.get(ev)]
    return sorted(evs, key=lambda e: (e["t"], e["ev"] == "start"))


PEER = Peer(
    name="dbos", column="DBOS", label="DBOS Transact (SQLite) behind FastAPI + uvicorn", section="peer dbos",
    venv=HERE.parent / ".peer-venv-dbos", requirements=["dbos~=3.4.0", "fastapi", "uvicorn[standard]"],
    probe="import dbos, fastapi, uvicorn, uvloop",
    dists=("dbos", "fastapi", "uvicorn", "uvloop", "sqlalchemy"),
    server=Server, driver=DbosDriver,
    handoff_note="last step -> next workflow's first step (queue polled)",
    wait_note="POST's enqueue -> first step", cpu_note="its one server process (uvicorn, DBOS's threads, SQLite)",
)
