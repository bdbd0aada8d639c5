"""Model usage reaches the gateways' ``/metrics`` summed: a runner adds each model request's usage
to its model's and purpose's sum and sends the sums within ``USAGE_FLUSH_S`` (one message, not one
per request); a gateway counts a list of sums, or one sample alone as a single request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cox_gateway import metrics
from cox_runner import clients as clients_mod
from cox_runner.clients import Clients
from coxswain import subjects


class Bus:
    """Records what is published (the runner's side alone: no server in this test)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, json.loads(data)))


def _clients(bus: Bus) -> Clients:
    return Clients(bus, None)  # type: ignore[arg-type]


def test_a_runner_sends_one_sum_per_model_and_purpose() -> None:
    async def go() -> Bus:
        bus = Bus()
        c = _clients(bus)
        for n in (10, 20, 30):
            await c.usage_seen({"model": "m1", "purpose": "turn", "input_tokens": n, "output_tokens": 1, "cost": 0.5})
        await c.usage_seen({"model": "m1", "purpose": "title", "input_tokens": 7, "cache_read_tokens": 3})
        await c.usage_seen({"model": "m2", "purpose": "turn", "input_tokens": True, "output_tokens": -4,
                            "cost": "free"})  # not counts: left out, the request still counted
        assert bus.sent == [], "nothing goes out per request"
        await c.flush_usage()
        await c.flush_usage()  # nothing new: nothing sent
        return bus

    bus = asyncio.run(go())
    assert len(bus.sent) == 1 and bus.sent[0][0] == subjects.USAGE_METRICS
    sums = {(s["model"], s["purpose"]): s for s in bus.sent[0][1]}
    assert sums[("m1", "turn")] == {"model": "m1", "purpose": "turn", "requests": 3, "input_tokens": 60,
                                    "output_tokens": 3, "cache_read_tokens": 0, "cache_write_tokens": 0, "cost": 1.5}
    assert sums[("m1", "title")]["requests"] == 1 and sums[("m1", "title")]["cache_read_tokens"] == 3
    assert sums[("m2", "turn")] == {"model": "m2", "purpose": "turn", "requests": 1, "input_tokens": 0,
                                    "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0, "cost": 0.0}


def test_the_sums_go_out_by_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients_mod, "USAGE_FLUSH_S", 0.01)

    async def go() -> Bus:
        bus = Bus()
        c = _clients(bus)
        await c.usage_seen({"model": "m1", "purpose": "turn", "input_tokens": 5})
        await c.usage_seen({"model": "m1", "purpose": "turn", "input_tokens": 6})
        for _ in range(200):
            if bus.sent:
                break
            await asyncio.sleep(0.01)
        await c.usage_seen({"model": "m1", "purpose": "turn", "input_tokens": 1})
        for _ in range(200):
            if len(bus.sent) == 2:
                break
            await asyncio.sleep(0.01)
        return bus

    bus = asyncio.run(go())
    assert [[(s["requests"], s["input_tokens"]) for s in sums] for _, sums in bus.sent] == [[(2, 11)], [(1, 1)]]


def _value(counter: Any, *labels: str) -> float:
    return float(counter.labels(*labels)._value.get())


def test_a_gateway_counts_sums_and_single_samples() -> None:
    before = (_value(metrics.MODEL_REQUESTS, "gm", "turn"), _value(metrics.MODEL_TOKENS, "gm", "turn", "input"),
              _value(metrics.MODEL_COST, "gm", "turn"))
    metrics.count_usage({"model": "gm", "purpose": "turn", "requests": 3, "input_tokens": 60, "cost": 1.5})
    metrics.count_usage({"model": "gm", "purpose": "turn", "input_tokens": 4})  # a runner of before: one request
    after = (_value(metrics.MODEL_REQUESTS, "gm", "turn"), _value(metrics.MODEL_TOKENS, "gm", "turn", "input"),
             _value(metrics.MODEL_COST, "gm", "turn"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [4.0, 64.0, 1.5]
    with pytest.raises(ValueError, match="requests"):
        metrics.count_usage({"model": "gm", "purpose": "turn", "requests": -1})
    assert _value(metrics.MODEL_REQUESTS, "gm", "turn") == after[0]
