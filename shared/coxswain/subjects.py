"""NATS subject and stream names. Services build subjects here, never inline.

Layout:
    cox.rpc.<service>.<op>     request-reply, queue group per service (any replica answers)
    cox.rpc.<service>.<op>.<id> the same on one replica: a session's operation sent to its home
                               runner, where its turns run (coxswain.rpc, Op.home)
    cox.ctl.<runner_id>        doorbell to the runner that holds a session's lease
    cox.ev.<sid>               a session's events, stored in the COX_EVENTS JetStream stream
    $SRV.PING.<service>        health (nats micro), one reply per replica
    _INBOX.<service>.>         replies to a service's own requests (no other service may read them)
"""

from __future__ import annotations

from typing import Final

from .ids import check_id

EVENTS_STREAM: Final = "COX_EVENTS"
EVENTS_WILDCARD: Final = "cox.ev.>"
CONTROL_WILDCARD: Final = "cox.ctl.*"
USAGE_METRICS: Final = "cox.metrics.usage"
"""Each model request's usage (the ``usage`` event's fields), published by the runner for the
gateways' ``/metrics`` (core NATS: a sample lost while a gateway is down is a metric, not a record)."""
USAGE_METRICS_GROUP: Final = "q-gateway-metrics"
"""Gateways share the usage samples: each is counted by one of them (sum them across gateways)."""

GATEWAY: Final = "gateway"
RUNNER: Final = "turn-runner"
GUARD: Final = "guard"
JUDGE: Final = "judge"
VERSIONS: Final = "versions"
SERVICES: Final = (GATEWAY, RUNNER, GUARD, JUDGE, VERSIONS)


def rpc(service: str, op: str) -> str:
    """The request-reply subject of ``op`` on ``service``."""
    return f"cox.rpc.{service}.{op}"


def rpc_at(service: str, op: str, instance: str) -> str:
    """The request-reply subject of ``op`` on one replica of ``service`` (``instance``, its id):
    no queue group, so only that replica answers."""
    return f"cox.rpc.{service}.{op}.{check_id(instance, 'instance id')}"


def queue_group(service: str) -> str:
    """Replicas of one service share a queue group so each request reaches one of them."""
    return f"q-{service}"


def control(runner_id: str) -> str:
    """Doorbell subject of one runner process; the payload only says which session to look at."""
    return f"cox.ctl.{check_id(runner_id, 'runner id')}"


def events(sid: str) -> str:
    """Subject of one session's event log."""
    return f"cox.ev.{check_id(sid, 'session id')}"


def ping(service: str) -> str:
    """nats micro's PING subject for every replica of ``service``."""
    return f"$SRV.PING.{service}"


def inbox(service: str) -> str:
    """The inbox prefix of ``service``'s connection: its NATS user may subscribe only below it,
    so no other service can read the replies it is sent (approvals, versions, events)."""
    return f"_INBOX.{service}"
