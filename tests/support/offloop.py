"""Whether an import is made off the event loop: checked in a fresh interpreter (a test process
has imported everything already).

:func:`imports_off_the_loop` runs ``load`` (an awaitable expression) twice on a running loop, the
second time a no-op, while a task ticks on the loop, and records the thread of every import of
``watched``: they must all be off the loop's thread, and the loop must have run meanwhile.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio, sys, threading
seen = []
sys.addaudithook(lambda ev, args: ev == "import" and args[0] in {watched!r}
                 and seen.append((args[0], threading.get_ident())))
{setup}
assert not set({watched!r}) & set(sys.modules), "imported before the load"
loop_thread = threading.get_ident()
ticks = 0

async def ticker():
    global ticks
    while True:
        ticks += 1
        await asyncio.sleep(0)

async def main():
    t = asyncio.create_task(ticker())
    await {load}
    t.cancel()
    await {load}  # imported: nothing to do

asyncio.run(main())
assert {loaded!r} in sys.modules, "the load did not import it"
assert seen and all(ident != loop_thread for _, ident in seen), seen
print(ticks)
"""


def imports_off_the_loop(setup: str, load: str, watched: tuple[str, ...], loaded: str) -> None:
    """``setup`` (imports, one line each) then ``await load`` imports ``loaded`` and every module of
    ``watched`` it imports is imported off the loop's thread while the loop runs."""
    code = SCRIPT.format(setup=setup, load=load, watched=watched, loaded=loaded)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip()) > 0, "the loop did not run while it was imported"
