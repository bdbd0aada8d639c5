"""A request's own transition id through two runners' stores (``Store.call``'s ``tx``), on a real
Redis with the library loaded: the gateway may send a session's send to its late home and to any
runner too (``bus.call_home``), under one id. The first store to run it makes the change and acts
on the reply; the other gets the same reply marked ``replay`` (nothing recorded, nothing to start),
and a request read too late to be sure of that (older than ``REQUEST_TX_FRESH_S``) is not run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from cox_runner.redis import store as store_mod
from cox_runner.redis.store import Store
from coxswain import keys
from coxswain.errors import Busy, Unavailable
from coxswain.ids import new_id, time_letters
from tests.redis.test_passes import run


async def session(store: Store, sid: str) -> None:
    body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    await store.fns.create(sid=sid, principal="p", workspace="/w", model="script", title="", body=body, owner="")


async def send(store: Store, sid: str, tx: str, runner: str) -> dict[str, Any]:
    return dict(await store.fns.send(sid=sid, principal="p", message_id=new_id("m"), text="once", mode="",
                                     client_id="", runner=runner, lease_ms=5000, turn_id=new_id("t"), owner="",
                                     models="", agents_md="", tx=tx))


def test_one_request_sent_to_two_runners_is_made_once_and_the_second_is_a_replay(tmp_path: Path) -> None:
    async def go(stores: list[Store], r: Any) -> None:
        home, other = stores
        await session(home, "s_two")
        tx = new_id("x")
        first = await send(other, "s_two", tx, "r_other")
        assert first["disposition"] == "started" and not first.get("replay"), first
        base = keys.session("s_two")
        seq = await r.hget(base, "seq")
        late = await send(home, "s_two", tx, "r_home")
        assert late.get("replay") is True, "the late home would act on a change it did not make"
        assert {k: v for k, v in late.items() if k != "replay"} == first
        assert await r.hget(base, "seq") == seq and await r.llen(base + keys.QUEUE) == 0
        # a request of its own on the home is run as ever (and finds the turn running)
        with pytest.raises(Busy):
            await send(home, "s_two", new_id("x"), "r_home")

    run(tmp_path, go, stores=2)


def test_a_request_read_after_its_kept_reply_may_be_gone_is_not_run(tmp_path: Path) -> None:
    async def go(stores: list[Store], r: Any) -> None:
        (store,) = stores
        await session(store, "s_old")
        base = keys.session("s_old")
        seq = await r.hget(base, "seq")
        born = int((time.time() - store_mod.REQUEST_TX_FRESH_S - 5) * 1000)
        stale = "x_" + time_letters(born) + "abcdefghjkmnpqrstvwx"
        with pytest.raises(Unavailable, match="older than its caller waits"):
            await send(store, "s_old", stale, "r_1")
        assert await r.hget(base, "seq") == seq and await r.hget(base, "busy") != "1"
        fresh = "x_" + time_letters(int((time.time() - 20) * 1000)) + "abcdefghjkmnpqrstvwx"
        assert (await send(store, "s_old", fresh, "r_1"))["disposition"] == "started", "20 s old: run"

    run(tmp_path, go, stores=1)
