"""What the command sandbox costs per command: ``true`` through bubblewrap vs bare.

Both go through the runner's own code path (:func:`cox_runner.workspace.tools.run_command` with a
:class:`cox_runner.workspace.sandbox.Sandbox` in mode ``bwrap`` and in mode ``none``), alternating A B A B
so drift on a shared machine hits both alike. The floor is the bare command: spawning bash
with the scrubbed environment, reading its output and reaping it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from cox_runner.workspace import tools
from cox_runner.workspace.sandbox import Sandbox
from coxswain.config import SandboxConfig

from .stats import ratio, summary


async def per_command(n: int, warmup: int = 20) -> dict[str, Any]:
    if shutil.which("bwrap") is None:
        raise RuntimeError("bwrap is not installed (apt-get install bubblewrap)")
    with tempfile.TemporaryDirectory(prefix="cox-bench-sandbox-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        boxed = Sandbox(SandboxConfig(mode="bwrap"), ".coxswain")
        bare = Sandbox(SandboxConfig(mode="none"), ".coxswain")
        status = await boxed.probe()
        if not status.available:
            raise RuntimeError(f"the sandbox cannot start here: {status.reason}")
        times: dict[str, list[float]] = {"bwrap": [], "bare": []}
        for i in range(warmup + n):
            for name, sb in (("bwrap", boxed), ("bare", bare)):
                t0 = time.perf_counter()
                res = await tools.run_command(ws, "true", 10.0, 1024, sb)
                dt = (time.perf_counter() - t0) * 1000
                if res.exit_code != 0:
                    raise RuntimeError(f"`true` failed in {name}: {res.output}")
                if i >= warmup:
                    times[name].append(dt)
    out: dict[str, Any] = {k: summary(v) for k, v in times.items()}
    out["ratio_p50"] = ratio(out["bwrap"]["p50"], out["bare"]["p50"])
    out["ratio_p99"] = ratio(out["bwrap"]["p99"], out["bare"]["p99"])
    out["added_p50_ms"] = round(out["bwrap"]["p50"] - out["bare"]["p50"], 3)
    return out
