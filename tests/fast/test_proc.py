"""coxswain.proc: a child never outlives the process that started it, even when that process
dies between the fork and the child's ``PR_SET_PDEATHSIG`` (the kernel then sends nothing)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess

from coxswain.proc import die_with_parent, dies_with_me


def test_a_child_of_this_process_runs() -> None:
    r = subprocess.run(["sh", "-c", "echo ran"], preexec_fn=dies_with_me(), capture_output=True, text=True,
                       timeout=30)
    assert (r.returncode, r.stdout) == (0, "ran\n")


def test_a_child_whose_parent_is_not_the_one_that_forked_it_ends_before_it_runs() -> None:
    """As after the parent's death before the prctl: the child was reparented, so its parent is
    not the pid it was given. It must end, not run its command unwatched."""
    not_the_parent = os.getppid()  # this process's parent, never its child's
    r = subprocess.run(["sh", "-c", "echo ran"], preexec_fn=functools.partial(die_with_parent, not_the_parent),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 128 + signal.SIGTERM and r.stdout == ""
