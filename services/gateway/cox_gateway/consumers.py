"""The gateway's durable JetStream consumers of the events stream (webhooks, traces): binding
one (made, or its editable settings brought up to date) and the loop that keeps it consumed
through NATS failures. Each user says what it does with a message (``_consume``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

from coxswain import subjects
from coxswain.errors import logged

RESUBSCRIBE_S = 1.0
"""How long a consumer waits before it is set up again after a failure."""
EDITABLE = ("ack_wait", "max_ack_pending", "max_deliver", "description")
"""What may change of a durable consumer; its start (deliver policy) stays."""


async def bind(js: JetStreamContext, want: api.ConsumerConfig, log: Any, what: str) -> Any:
    """A pull subscription on the durable consumer ``want`` names, made if missing, else with
    its editable settings set as ``want`` has them (logged ``<what>.consumer_updated``)."""
    stream, name = subjects.EVENTS_STREAM, str(want.durable_name)
    try:
        have = (await js.consumer_info(stream, name)).config
    except nats.js.errors.NotFoundError:
        await js.add_consumer(stream, want)
    else:
        editable = {k: getattr(want, k) for k in EDITABLE}
        changed = {k: v for k, v in editable.items() if getattr(have, k) != v}
        if changed:
            await js.add_consumer(stream, have.evolve(**editable))
            log.info(f"{what}.consumer_updated", consumer=name, changed=sorted(changed))
    return await js.pull_subscribe_bind(durable=name, stream=stream)


class Consuming:
    """A durable consumer kept consumed: ``state`` (``starting``, ``running``, ``retrying``) and
    the kind of the last ``error`` for health; each failure logged, then set up again."""

    _log: Any
    state: str = "starting"
    error: str | None = None

    async def _subscribe(self) -> Any:
        raise NotImplementedError

    async def _consume(self, sub: Any) -> None:
        raise NotImplementedError

    async def _keep_consuming(self, what: str, consumer: str) -> None:
        while True:
            sub: Any = None
            try:
                sub = await self._subscribe()
                self.state, self.error = "running", None
                self._log.info(f"{what}.consuming", consumer=consumer)
                await self._consume(sub)
            except (nats.errors.Error, OSError) as exc:
                # Once per kind of failure (before the runner made the stream: NotFoundError).
                seen, self.error = self.error, type(exc).__name__
                self.state = "retrying"
                (self._log.debug if seen == self.error else self._log.warning)(
                    f"{what}.consumer_failed", error=logged(exc))
            except Exception as exc:  # noqa: BLE001 - a bug: seen, and the consumer carries on
                self.state, self.error = "retrying", type(exc).__name__
                self._log.error(f"{what}.consumer_failed", error=logged(exc), exc_info=exc)
            finally:
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
            await asyncio.sleep(RESUBSCRIBE_S)
