"""What the resource limits cost per command (cox_runner.workspace.limits): ``true`` through bubblewrap
with cgroups + rlimits, with rlimits only, and with neither, alternated (A B C, B C A, C A B, ...).

Same code path (:func:`cox_runner.workspace.tools.run_command`); the variants differ only in the limiter:
the full one makes and removes the command's cgroups (one per v1 hierarchy) and prefixes the
cgroup join (``/bin/sh``) and ``prlimit``; "rlimits" prefixes ``prlimit`` only; "none" nothing.
Also the runner-side cost alone: make + configure + remove a command's cgroups.

Run: ``.venv/bin/python -m bench.limits [N]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cox_runner.workspace import limits, tools
from cox_runner.workspace.sandbox import Sandbox
from coxswain.config import SandboxConfig

from .stats import ratio, summary


async def per_command(n: int, warmup: int = 20) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cox-bench-limits-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        variants: dict[str, Sandbox] = {}
        for name in ("cgroups+rlimits", "rlimits", "none"):
            sb = Sandbox(SandboxConfig(mode="bwrap"), ".coxswain")
            if not (await sb.probe()).available:
                raise RuntimeError("the sandbox cannot start here")
            lim = limits.of(sb)
            st = lim.probe()
            if name != "cgroups+rlimits":
                lim._status = limits.LimitsStatus("off", reason="bench")
            if name == "none":
                lim._prlimit = None
            variants[name] = sb
            if name == "cgroups+rlimits" and st.cgroups == "off":
                raise RuntimeError(f"no cgroups here: {st.reason}")
        times: dict[str, list[float]] = {k: [] for k in variants}
        order = list(variants.items())
        for i in range(warmup + n):
            for name, sb in order[i % 3:] + order[:i % 3]:  # each variant first in turn
                t0 = time.perf_counter()
                res = await tools.run_command(ws, "true", 10.0, 1024, sb)
                dt = (time.perf_counter() - t0) * 1000
                if res.exit_code != 0:
                    raise RuntimeError(f"`true` failed with {name}: {res.output}")
                if i >= warmup:
                    times[name].append(dt)
        lim = limits.of(variants["cgroups+rlimits"])
        box_ms: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            lim.box("cmd").remove()
            box_ms.append((time.perf_counter() - t0) * 1000)
    out: dict[str, Any] = {k: summary(v) for k, v in times.items()}
    out["cgroup_make_remove"] = summary(box_ms)
    out["ratio_p50"] = ratio(out["cgroups+rlimits"]["p50"], out["none"]["p50"])
    out["added_p50_ms"] = round(out["cgroups+rlimits"]["p50"] - out["none"]["p50"], 3)
    out["added_p50_ms_rlimits_only"] = round(out["rlimits"]["p50"] - out["none"]["p50"], 3)
    out["controllers"] = lim.status().controllers
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(per_command(int(sys.argv[1]) if len(sys.argv) > 1 else 300)), indent=1))
