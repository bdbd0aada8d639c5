"""Who may do what on the servers: each service's NATS subject permissions and Redis ACL.

Every service connects as its own user, named after the service; ``admin`` has every right (for
``cox up``'s operator, the tests and the bench). Nobody else gets in: nats-server refuses a
connection without a known user, and Redis answers ``NOAUTH`` to a client that has not logged in.

NATS. A service may subscribe to its own request subjects (``cox.rpc.<service>.*``), to nats
micro's ``$SRV`` subjects for it and to its own inbox (``_INBOX.<service>.>``, see
:func:`coxswain.subjects.inbox`); it answers what it is asked (``allow_responses``) and publishes
only the requests it makes: those whose callers in :mod:`coxswain.rpc` name it (:func:`requests_of`),
never a wildcard, so the table is the one list of who calls what. Only the runner publishes events (``cox.ev.>``), rings doorbells
(``cox.ctl.*``) and owns the events stream; the gateway and versions read a session's events
through ephemeral consumers filtered on its subject. Guard and judge publish nothing but replies.

Redis. The gateway reads sessions; versions reads sessions and owns its MAC key; the runner
reads and writes sessions and the global indexes, loads and calls the function library, and can
neither read the versions key nor run an administrative command. ``default`` is admin under
another name (see :func:`redis_users` for why it is not off).

The same tables configure the servers ``cox up`` and the tests start (``cox.servers``) and the
compose file (``deploy/nats.conf``, the redis command in ``docker-compose.yml``; a test keeps
them equal).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from . import keys, rpc, subjects
from .subjects import GATEWAY, GUARD, JUDGE, RUNNER, VERSIONS

ADMIN: Final = "admin"
NATS_USERS: Final = (ADMIN, *subjects.SERVICES)
REDIS_USERS: Final = (ADMIN, GATEWAY, RUNNER, VERSIONS)
"""Guard and judge do not use Redis, so they have no user there."""


@dataclass(frozen=True)
class NatsPermissions:
    publish: tuple[str, ...]
    """Subjects it may publish to; empty: none but replies to what it received."""
    subscribe: tuple[str, ...]


def requests_of(service: str) -> tuple[str, ...]:
    """The request subjects ``service`` may publish: every operation of :mod:`coxswain.rpc` whose
    callers name it (health included), so a call the table lists is never refused by NATS; a
    session's operation also on each replica (:attr:`coxswain.rpc.Op.home`)."""
    out: list[str] = []
    for op in rpc.called_by(service):
        out.append(op.subject)
        if op.home:
            out.append(op.subject + ".*")
    return tuple(out)


def _serves(service: str) -> tuple[str, ...]:
    """Its request subjects (a replica's own too, when it serves a session's operations:
    :attr:`coxswain.rpc.Op.home`) and nats micro's (``$SRV.PING``, ``$SRV.PING.<name>[.<id>]``, ...)."""
    own = (subjects.rpc(service, "*") + ".*",) if any(op.home for op in rpc.served_by(service)) else ()
    return (subjects.rpc(service, "*"), *own, "$SRV.*", f"$SRV.*.{service}", f"$SRV.*.{service}.*")


def _calls(service: str) -> tuple[str, ...]:
    """The replies to its own requests (and the messages its JetStream consumers deliver)."""
    return (f"{subjects.inbox(service)}.>",)


_JS = "$JS.API"
_STREAM = subjects.EVENTS_STREAM
READ_EVENTS: Final = (
    # nats-py names the consumer and puts its filter in the subject: only cox.ev.<sid> filters.
    f"{_JS}.CONSUMER.CREATE.{_STREAM}.*.{subjects.EVENTS_WILDCARD}",
    f"{_JS}.CONSUMER.MSG.NEXT.{_STREAM}.*",
    f"{_JS}.CONSUMER.DELETE.{_STREAM}.*",
)
"""The JetStream API an events reader uses (``eventlog.EventFeed``)."""
LAST_EVENT: Final = f"{_JS}.DIRECT.GET.{_STREAM}.{subjects.EVENTS_WILDCARD}"
"""``eventlog.last_in_stream``: a session's last event (a direct get by subject), which each
conditional publish is checked against."""
TAIL_EVENTS: Final = f"{_JS}.DIRECT.GET.{_STREAM}"
"""``eventlog.tail``: a session's next message from a stream seq on (a direct get whose body names
the session's subject): the events stream only, which the runner reads whole anyway."""
NOTIFY: Final = (
    f"{_JS}.CONSUMER.INFO.{_STREAM}.*",
    f"$JS.ACK.{_STREAM}.>",
)
"""The gateway's webhook consumers (``cox_gateway.notifier``): one durable consumer per webhook
(created like a reader's, with ``READ_EVENTS``), its state, and the acks, naks and terms of what
it was delivered. The trace exporter's consumer (``cox_gateway.tracer``, ``cox-traces``) uses
the same."""
OWN_STREAM: Final = tuple(f"{_JS}.STREAM.{op}.{_STREAM}" for op in ("INFO", "CREATE", "UPDATE"))
"""``eventlog.ensure_stream``: never DELETE, PURGE or MSG.DELETE."""
_ARCHIVE = "KV_COX_ARCHIVE"  # coxswain.archive.STREAM (not imported: archive imports the models)
READ_ARCHIVE: Final = (f"{_JS}.STREAM.INFO.{_ARCHIVE}", f"{_JS}.DIRECT.GET.{_ARCHIVE}.$KV.COX_ARCHIVE.*")
"""``coxswain.archive``: an archived session's entry (the bucket's info, a direct get by key)."""
OWN_ARCHIVE: Final = (f"{_JS}.STREAM.CREATE.{_ARCHIVE}", "$KV.COX_ARCHIVE.*")
"""``cox_runner.redis.archive``: make the bucket, put and delete entries (a publish to the key)."""

NATS: Final[Mapping[str, NatsPermissions]] = {
    GATEWAY: NatsPermissions(
        publish=(*requests_of(GATEWAY), *READ_EVENTS, *READ_ARCHIVE, *NOTIFY),
        subscribe=(*_serves(GATEWAY), *_calls(GATEWAY), subjects.EVENTS_WILDCARD, subjects.USAGE_METRICS),
    ),
    RUNNER: NatsPermissions(
        publish=(*requests_of(RUNNER), subjects.CONTROL_WILDCARD, subjects.EVENTS_WILDCARD, *OWN_STREAM,
                 LAST_EVENT, TAIL_EVENTS, *READ_EVENTS, subjects.USAGE_METRICS, *READ_ARCHIVE, *OWN_ARCHIVE),
        subscribe=(*_serves(RUNNER), *_calls(RUNNER), subjects.CONTROL_WILDCARD),
    ),
    GUARD: NatsPermissions(publish=requests_of(GUARD), subscribe=_serves(GUARD)),
    JUDGE: NatsPermissions(publish=requests_of(JUDGE), subscribe=_serves(JUDGE)),
    VERSIONS: NatsPermissions(publish=(*requests_of(VERSIONS), *READ_EVENTS, *READ_ARCHIVE),
                              subscribe=(*_serves(VERSIONS), *_calls(VERSIONS))),
}


def nats_string(value: str) -> str:
    """``value`` as a quoted string of nats-server's config."""
    return json.dumps(value)


def nats_authorization(passwords: Mapping[str, str]) -> str:
    """The ``authorization`` block of nats-server's config: ``admin`` and a user per service.

    ``passwords`` maps each of :data:`NATS_USERS` to its password as the config spells it: a
    quoted string (:func:`nats_string`) or a variable reference (``$COX_GATEWAY_PASSWORD``).
    """
    out = ["authorization {", "  users = ["]
    for user in NATS_USERS:
        head = f"    {{user: {nats_string(user)}, password: {passwords[user]}"
        perms = NATS.get(user)
        if perms is None:
            out.append(head + "}")
            continue
        out.append(head + ", permissions: {")
        if perms.publish:
            out.append(f"      publish: {{allow: {_list(perms.publish)}}}")
        out.append(f"      subscribe: {{allow: {_list(perms.subscribe)}}}")
        out.append("      allow_responses: true")
        out.append("    }}")
    out += ["  ]", "}"]
    return "\n".join(out) + "\n"


def _list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(nats_string(i) for i in items) + "]"


_SESSIONS = f"{keys.PREFIX}:s:*"
_PRINCIPALS = f"{keys.PREFIX}:p:*"
_LEASES = f"{keys.LEASES_PREFIX}*"
_DIRTY = f"{keys.DIRTY_PREFIX}*"
_ACTIVE = f"{keys.ACTIVE_PREFIX}*"
_PAUSED = f"{keys.PAUSED_PREFIX}*"
_PASSES = f"{keys.PASS_PREFIX}*"
"""The stack's takeover and sweeper passes: which runner makes this period's."""
"""The buckets' paused sessions (a daily budget reached)."""
_WORKSPACES = f"{keys.PREFIX}:{keys.WS_TAG}:*"
_RUNS = f"{keys.PREFIX}:runs:*"
"""Each principal's runs (``GET /v1/runs``)."""
_RUN_SLOTS = f"{keys.PREFIX}:{keys.RUNS_TAG}:*"
"""The stack's run slots (``[runs] max_active``)."""
# the cluster client learns the slot map (CLUSTER SLOTS / SHARDS) and key positions (COMMAND,
# in @connection); harmless against one server
_CLUSTER = ("+cluster|slots", "+cluster|shards", "+cluster|info", "+cluster|nodes", "+cluster|myid")
_CONNECTION = ("resetchannels", "-@all", "+@connection")

REDIS: Final[Mapping[str, tuple[str, ...]]] = {
    ADMIN: ("~*", "&*", "+@all"),
    GATEWAY: (f"%R~{_SESSIONS}", f"%R~{_PRINCIPALS}", f"%R~{_RUNS}", f"%R~{keys.META}", *_CONNECTION, "+@read", "+@transaction",
              "-@dangerous", *_CLUSTER),
    VERSIONS: (f"%R~{_SESSIONS}", f"~{keys.VERSIONS_MAC_KEY}", f"%R~{keys.META}", *_CONNECTION, "+@read", "+set",
               "-@dangerous", *_CLUSTER),
    RUNNER: (f"~{_SESSIONS}", f"~{_PRINCIPALS}", f"~{_LEASES}", f"~{_DIRTY}", f"~{_ACTIVE}", f"~{_PAUSED}", f"~{_PASSES}", f"~{keys.META}",
             f"~{_WORKSPACES}", f"~{_RUNS}", f"~{_RUN_SLOTS}", *_CONNECTION,
             "+@read", "+@write", "+@transaction", "+fcall", "+function|load", "+time", "-@dangerous",
             # the runner's start-up check that Redis fsyncs every write (appendfsync always)
             "+config|get", *_CLUSTER),
}
"""ACL rules per user (after ``on`` and its password). ``-@dangerous`` comes after the
categories it trims (KEYS, FLUSHALL, CONFIG SET, ACL, DEBUG, ...)."""


def redis_password_hash(password: str) -> str:
    """An ACL password spec that holds only the password's SHA-256 (``#<hex>``)."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def redis_users(passwords: Mapping[str, str]) -> list[list[str]]:
    """Every ACL user as ``[name, rule, ...]``, ``default`` first.

    ``passwords`` maps each of :data:`REDIS_USERS` to an ACL password spec: ``#<sha256>``
    (:func:`redis_password_hash`) or ``>password``.

    ``default`` is admin under another name (admin's password and rights), not off: Redis
    replays its append-only file as ``default`` and refuses a replayed MULTI/EXEC (every runner
    transition: a function call's writes are logged as one) that ``default`` may not run, so a
    restart would silently lose them (redis/redis#14541, fixed after 7.4). A client without
    credentials still gets ``NOAUTH``.
    """
    users = [["default", "on", passwords[ADMIN], *REDIS[ADMIN]]]
    users += [[user, "on", passwords[user], *REDIS[user]] for user in REDIS_USERS]
    return users


def redis_user_args(passwords: Mapping[str, str]) -> list[str]:
    """:func:`redis_users` as ``redis-server`` arguments (``--user NAME on ...`` each)."""
    return [arg for user in redis_users(passwords) for arg in ("--user", *user)]
