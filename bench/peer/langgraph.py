"""The peer LangGraph: its in-memory dev server, offline, serving ``lg_graph.py``.

``--peer langgraph`` installs ``langgraph-cli[inmem]`` and ``langgraph`` into their own venv
(``bench/.peer-venv``, never the project's), writes a project folder holding ``lg_graph.py``
(three 5 ms tool rounds, no LLM) and runs ``langgraph dev --no-browser --no-reload`` on
127.0.0.1, offline (tracing off; it phones nowhere we need).

- queue: threads with ``multitask_strategy="enqueue"`` against our ``mode=queue``.
- interrupt: ``multitask_strategy="interrupt"`` against our ``mode=steer``; no overlap means no
  checkpoint of the interrupted run written after the new run's first node.

LangGraph's times are its graph's own ``time.time()`` (first and last node) and its runs' and
checkpoints' ``created_at``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from ..profiles import Counts
from .base import TIMEOUT_S, Driver, Peer, PeerServer, get_ok, post_ok

HERE = Path(__file__).resolve().parent
STRATEGY = {"queue": "enqueue", "interrupt": "interrupt"}


class Server(PeerServer):
    project = "langgraph-project"
    env_drop = ("LANGSMITH", "LANGCHAIN", "OPENAI")

    def __init__(self, tmp: Path, bin_dir: Path, c: Counts) -> None:
        super().__init__(tmp, bin_dir, c)
        self.jobs = max(10, max(c.peer_threads))
        shutil.copy(HERE / "lg_graph.py", self.dir / "lg_graph.py")
        (self.dir / "langgraph.json").write_text(json.dumps(
            {"dependencies": ["."], "graphs": {"bench": "./lg_graph.py:graph"}}))

    def argv(self) -> list[str]:
        return [str(self.bin / "langgraph"), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
                "--port", str(self.port), "--n-jobs-per-worker", str(self.jobs), "--config", "langgraph.json"]

    def env(self) -> dict[str, str]:
        return {**super().env(), "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false"}

    def settings(self) -> dict[str, Any]:
        return {"n_jobs_per_worker": self.jobs}


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


class LangGraphDriver(Driver):
    async def session(self) -> str:
        return str((await post_ok(self.pool, "/threads", {}))["thread_id"])

    async def post(self, sid: str, marker: str, target: int, mode: str) -> dict[str, Any]:
        return dict(await post_ok(self.pool, f"/threads/{sid}/runs", {
            "assistant_id": "bench", "input": {"marker": marker, "rounds": 0, "target": target},
            "multitask_strategy": STRATEGY[mode]}))

    def created(self, run: dict[str, Any]) -> float:
        return _ts(run["created_at"])

    async def wait_running(self, sid: str, run: dict[str, Any]) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            _, r = await self.pool.get(f"/threads/{sid}/runs/{run['run_id']}")
            if isinstance(r, dict) and r.get("status") == "running":
                await asyncio.sleep(0.05)  # well inside its tool rounds
                return
            await asyncio.sleep(0.02)
        raise TimeoutError("the long run never started")

    async def join(self, last: dict[str, dict[str, Any]]) -> None:
        await asyncio.gather(*(get_ok(self.pool, f"/threads/{sid}/runs/{r['run_id']}/join") for sid, r in last.items()))

    async def log(self, sid: str) -> list[dict[str, Any]]:
        return list((await get_ok(self.pool, f"/threads/{sid}/state"))["values"].get("log", []))

    async def interrupted(self, sid: str, old: dict[str, Any], new_start: float) -> list[str]:
        problems = []
        _, old_run = await self.pool.get(f"/threads/{sid}/runs/{old['run_id']}")
        if old_run.get("status") not in ("interrupted", "error"):
            problems.append(f"{sid}: the interrupted run ended {old_run.get('status')}")
        status, hist = await self.pool.post(f"/threads/{sid}/history", {"limit": 1000})
        if status != 200 or not isinstance(hist, list):
            raise RuntimeError(f"history answered {status}: {hist!r:.300}")
        late = [h for h in hist if (h.get("metadata") or {}).get("run_id") == old["run_id"]
                and _ts(h["created_at"]) > new_start]
        if late:
            problems.append(f"{sid}: {len(late)} checkpoints of the interrupted run after the new one started")
        return problems


PEER = Peer(
    name="langgraph", column="LangGraph", label="LangGraph in-memory dev server", section="peer",
    venv=HERE.parent / ".peer-venv", requirements=["langgraph-cli[inmem]>=0.4", "langgraph>=1.0"],
    probe="import langgraph_api, langgraph_runtime_inmem, langgraph.graph",
    dists=("langgraph", "langgraph-cli", "langgraph-api", "langgraph-runtime-inmem", "langgraph-checkpoint"),
    server=Server, driver=LangGraphDriver,
    handoff_note="last node -> next run's first node", wait_note="run created_at -> first node",
    cpu_note="its one server process",
)
