"""Ids: unguessable, unique across the processes that fork from one another (the services are forks
of cox up's fork server), and across threads."""

from __future__ import annotations

import os
import threading
from typing import Any

from coxswain import ids
from coxswain.ids import _ALPHABET, check_id, id_time, new_id


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


def test_an_ids_time_is_the_millisecond_it_was_made_in_even_when_the_last_one_was_remembered(monkeypatch: Any) -> None:
    """The nine time letters are remembered for the millisecond they were made in: the next
    millisecond makes its own, and the letters are the count's base32, most significant first."""
    now = [1_796_573_405.6415]
    monkeypatch.setattr("coxswain.ids.time.time", lambda: now[0])
    seen = []
    for step in (0.0, 0.0002, 0.0009, 0.001, 31.0, 1e6):
        now[0] += step
        ms = int(now[0] * 1000)
        want = "".join(_ALPHABET[(ms >> (5 * k)) & 31] for k in range(8, -1, -1))
        i = new_id("m")
        assert i.split("_", 1)[1][:9] == want == ids.time_letters(ms)
        assert id_time(i) == ms / 1000
        seen.append(i)
    times = [i[2:11] for i in seen]
    assert times == sorted(times) and len(set(times)) == 5, "ids of later milliseconds sort later"


def test_every_byte_maps_to_the_letter_of_its_low_five_bits() -> None:
    assert bytes(range(256)).translate(ids._LETTER).decode() == "".join(_ALPHABET[b & 31] for b in range(256))
