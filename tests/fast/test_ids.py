"""Ids: unguessable, unique across the processes that fork from one another (the services are forks
of cox up's fork server), and across threads."""

from __future__ import annotations

import os
import threading

from coxswain.ids import _ALPHABET, check_id, new_id


def _random_part(i: str) -> str:
    return i.split("_", 1)[1][9:]


def test_an_id_is_a_safe_id_with_time_then_twelve_random_characters() -> None:
    i = new_id("t")
    assert check_id(i) == i
    assert len(_random_part(i)) == 12 and set(_random_part(i)) <= set(_ALPHABET)


def test_ids_made_in_a_forked_child_do_not_repeat_the_parents() -> None:
    """Random bytes read ahead and kept in the process would be copied by fork: the child and the
    parent would then hand out the same ids (the same millisecond, the same random part)."""
    new_id("warm")  # whatever the parent keeps for later ids, it holds it now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next ids and leave without running anything else
        try:
            os.write(w, "\n".join(_random_part(new_id("c")) for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(w)
    parent = {_random_part(new_id("p")) for _ in range(50)}
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    child = set(b"".join(chunks).decode().split("\n"))
    assert len(child) == 50
    assert not parent & child


def test_ids_made_on_several_threads_at_once_are_all_different() -> None:
    out: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def make(k: int) -> None:
        start.wait()
        out[k] = [_random_part(new_id("x")) for _ in range(2000)]

    threads = [threading.Thread(target=make, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [x for part in out for x in part]
    assert len(set(every)) == len(every) == 16000
