"""What the ACP path costs (#26): a prompt through ``cox acp`` to its first ``agent_message_chunk``,
against the same send over HTTP + SSE to its first ``assistant.delta`` (the floor: what ``cox acp``
itself does underneath, from the same client process).

One ``cox up`` with one runner (the bench's own servers, :mod:`bench.stack`); the ACP side is
``cox acp`` spawned by the Agent Client Protocol SDK's client (stdio), one session; the HTTP side
is one session followed over SSE by this process. Prompts are plain text (the script model
answers ``echo: ...``, one chunk), alternated ACP / HTTP so drift hits both alike, each only
after the session is idle again.

Run: ``.venv/bin/python -m bench.acp [N]`` (default 200); it prints JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import httpx
from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.schema import ClientCapabilities, Implementation
from httpx_sse import aconnect_sse

from .stack import Servers, Stack
from .stats import ratio, summary


class Editor:
    """An ACP client that notes when each agent_message_chunk arrives."""

    def __init__(self) -> None:
        self.first: asyncio.Future[float] | None = None

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if update.session_update == "agent_message_chunk" and self.first is not None and not self.first.done():
            self.first.set_result(time.perf_counter())

    async def request_permission(self, **kwargs: Any) -> Any:
        raise RuntimeError("the bench asks for no permission")


async def idle(http: httpx.AsyncClient, sid: str) -> None:
    while (await http.get(f"/v1/sessions/{sid}")).json()["busy"]:
        await asyncio.sleep(0.01)


async def measure(stack: Stack, n: int, warmup: int = 10) -> dict[str, Any]:
    (stack.root / "acp").mkdir(parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {stack.token}"}
    url = f"http://127.0.0.1:{stack.port}"
    times: dict[str, list[float]] = {"acp": [], "http": []}
    editor = Editor()
    cox = str(Path(sys.executable).with_name("cox"))
    args = ["acp", "--url", url, "--token", stack.token, "--log", str(stack.tmp / "acp.log")]
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http, \
            spawn_agent_process(cast(Any, editor), cox, *args) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities(),
                              client_info=Implementation(name="bench", version="1"))
        acp_sid = (await conn.new_session(cwd=str(stack.root / "acp"), mcp_servers=[])).session_id
        r = await http.post("/v1/sessions", json={"workspace": "http"})
        r.raise_for_status()
        http_sid = r.json()["id"]
        deltas: asyncio.Queue[float] = asyncio.Queue()

        async def follow() -> None:
            async with aconnect_sse(http, "GET", f"/v1/sessions/{http_sid}/events",
                                    timeout=httpx.Timeout(30.0, read=None)) as source:
                async for sse in source.aiter_sse():
                    if sse.event == "assistant.delta":
                        deltas.put_nowait(time.perf_counter())

        follower = asyncio.create_task(follow())
        try:
            await asyncio.sleep(0.5)
            for i in range(warmup + n):
                editor.first = asyncio.get_running_loop().create_future()
                t0 = time.perf_counter()
                prompt = asyncio.create_task(conn.prompt(session_id=acp_sid, prompt=[text_block(f"acp {i}")]))
                first = await asyncio.wait_for(editor.first, 30)
                await prompt
                if i >= warmup:
                    times["acp"].append((first - t0) * 1000)

                t0 = time.perf_counter()
                r = await http.post(f"/v1/sessions/{http_sid}/messages", json={"text": f"http {i}"})
                r.raise_for_status()
                first = await asyncio.wait_for(deltas.get(), 30)
                if i >= warmup:
                    times["http"].append((first - t0) * 1000)
                await idle(http, http_sid)
        finally:
            follower.cancel()
    out: dict[str, Any] = {k: summary(v) for k, v in times.items()}
    out["ratio_p50"] = ratio(out["acp"]["p50"], out["http"]["p50"])
    out["ratio_p99"] = ratio(out["acp"]["p99"], out["http"]["p99"])
    out["added_p50_ms"] = round(out["acp"]["p50"] - out["http"]["p50"], 3)
    return out


async def main(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cox-bench-acp-") as tmp:
        servers = Servers(Path(tmp)).start()
        stack = Stack(Path(tmp) / "stack", servers, runners=1)
        try:
            stack.start()
            return await measure(stack, n)
        finally:
            stack.stop()
            servers.stop()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)), indent=2))
