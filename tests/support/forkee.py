"""A stand-in service for tests/fast/test_forkserver.py: says what it is told, then exits or waits."""

import os
import sys
import time

print(f"said {os.environ.get('FORKEE_SAY', '')} in {os.getcwd()}", flush=True)
if os.environ.get("FORKEE_WAIT"):
    time.sleep(600)
sys.exit(int(os.environ.get("FORKEE_CODE", "0")))
