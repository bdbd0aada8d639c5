"""The bench's CPU meter counts the context switches of every thread of a process (psutil's
``num_ctx_switches`` reads the main thread's alone on Linux)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from bench.stack import CpuMeter

CHILD = """
import sys, threading, time
go, napped = threading.Event(), threading.Event()
def nap():
    go.wait()
    for _ in range(20):
        time.sleep(0.005)
    napped.set()
    sys.stdin.readline()  # lives on (its switches counted) until told
t = threading.Thread(target=nap)
t.start()
sys.stdin.readline()
go.set()
napped.wait()
print("napped", flush=True)
t.join()
"""


def test_switches_of_a_worker_thread_are_counted() -> None:
    with subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            time.sleep(0.3)  # both threads started and waiting
            meter = CpuMeter({"child": psutil.Process(child.pid)}).start()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "napped"
            meter.stop()  # the worker alive: a thread's switches leave /proc with it
            child.stdin.write("end\n")
            child.stdin.flush()
            assert child.wait(10) == 0
        finally:
            child.kill()
    vol, _ = meter.switches["child"]
    # The main thread woke about three times (stdin, the event, stdout); the worker's 20 naps
    # are a wake-up each, seen only when every thread is counted.
    assert vol >= 20, meter.switches
