"""Redis key layout. Every key is owned by a session (deleted with it) or is a small index.

Sessions hash into a fixed number of buckets (``[redis] buckets``, fixed at first start and kept
in :data:`META`): ``bucket = crc32(sid) mod buckets``. Every key of a session, and its bucket's
lease and dirty indexes, carry the bucket's hash tag ``{b<n>}``, so one function call only ever
touches keys of one Redis Cluster slot. The Lua library (``cox_runner/redis/redis_lib.lua``) derives
the suffixed keys and the bucket's indexes from the session key, so the suffixes and index
prefixes below are mirrored there: change both.

The principal index (:func:`principal`) is on no bucket: it is written in its own call, before
the session is created (a listing skips an entry whose session does not exist).

The workspace records (:data:`WS_OWNERS`, :data:`WS_NAMES`, :func:`ws_principal`) share one hash
tag of their own, ``{ws}``: a claim (``cox_ws_claim``) must see every workspace at once to refuse
one inside or around another, so they live in one slot, apart from every session. A workspace is
claimed in its own call before its first session is created (one call cannot span two slots):
a crash between the two leaves a workspace its owner owns without a session, which is harmless.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from .ids import check_id

PREFIX: Final = "cox"

DEFAULT_BUCKETS: Final = 256
_buckets = DEFAULT_BUCKETS

META: Final = "cox:meta"
"""hash: ``buckets`` -> the bucket count the data was written with (set once, at first start)."""
LEASES_PREFIX: Final = "cox:leases:"
DIRTY_PREFIX: Final = "cox:dirty:"
ACTIVE_PREFIX: Final = "cox:active:"
PAUSED_PREFIX: Final = "cox:paused:"
PASS_PREFIX: Final = "cox:pass:"
VERSIONS_MAC_KEY: Final = "cox:versions:mac-key"
"""string: the versions service's HMAC key (hex). Index lines in a workspace's store folder are
members only with a valid MAC; the key lives here, out of reach of the model's commands."""

SESSION_FIELDS: Final[Mapping[str, str]] = MappingProxyType({
    # who and where (cox_create, cox_fork)
    "principal": "who owns the session; every call of a person checks it",
    "workspace": "the session's workspace folder (an absolute path under the root)",
    "created": "ms (Redis clock) when the session was created",
    "model": "the model the session's turns run on",
    "next_model": "a model chosen while a turn ran: it replaces model before the next turn starts, or at idle",
    "title": "the session's title ('' none yet)",
    "title_source": "'manual' (a person's), 'auto' (the runner's) or '' (none yet): auto never overwrites manual",
    "auto_title": "'1' while the runner may title the session from its first turn, '0' once a person turned it off",
    "dont_ask": "'1' when the don't-ask switch is on: the runner allows what would ask a person (not security)",
    # the log and the lease
    "seq": "the seq of the last event recorded (the outbox's next is seq + 1)",
    "pubpos": "'<event seq>:<stream seq>': where the session's JetStream subject ended when cox_pub_done last ran (a hint for the next publisher; cox_pub_done)",
    "fence": "the counter lease tokens are drawn from (HINCRBY: a token is never reused)",
    "busy": "'1' while a turn, or a person's op, holds the session; '0' idle",
    "runner": "the runner process holding the lease ('' none)",
    "token": "the lease's fencing token ('' none), as :lease holds it while the lease lives",
    "op": "the person's write holding the session while idle (cox_op_begin: restore, undo ...; '' none)",
    "blank": "'1' from cox_create until the session's first turn begins (a fork is never blank): its log holds "
             "nothing of a conversation, so that turn's transcript is its message alone (the reply's ``fresh``)",
    # the running turn ('' between turns)
    "turn_id": "the running turn's id",
    "message_id": "the message the running turn answers",
    "task": "the text of that message",
    "turn_started": "ms (Redis clock) when the running turn started",
    "stop": "'' or why the running turn must stop: 'stop' (a person's Stop) or 'steer' (a steer waits)",
    "lead_closed": "'1' once the running turn takes no more Leads (Stop, steer, or its final work)",
    # what the runner records with its events (cox_emit ops on the session hash)
    "plan": "JSON of the turn's plan (coxswain.models.Plan), carried to the next turn while steps are open",
    "mcp": "JSON of the MCP servers' states as the runner last recorded them ([{name, state, ...}])",
    "programs": "JSON of the programs running in the session's sandbox, as the runner that runs them last recorded "
                "them ([{program_id, name, command, started, by, tail, ...}]; cox_runner.programs)",
    "usage_requests": "model requests made so far (the session's usage totals)",
    "usage_input_tokens": "input tokens so far",
    "usage_output_tokens": "output tokens so far",
    "usage_cache_read_tokens": "tokens read from a provider's prompt cache so far",
    "usage_cache_write_tokens": "tokens written to a provider's prompt cache so far",
    "usage_cost": "USD so far (a float, rounded to 8 places when read)",
    # daily budgets ([limits] session_spend, principal_spend; docs/api.md "Budgets")
    "spend_day": "the UTC day (days since the epoch, Redis clock) spend_today counts (cox_emit's spend op)",
    "spend_today": "USD the session's model requests cost on spend_day (a float)",
    "spend_limit": "an admin's USD/day budget of this session (PATCH spend_limit), in place of [limits] "
                   "session_spend; absent: the configured one",
    "budget": "JSON {budget, limit, spent, day, detail} while a daily budget pauses the session (cox_turn_end): "
              "its messages wait and sends are refused budget_reached; absent otherwise",
    "spend_warned": "'<day>:<budget>,...': the daily budgets a limit.warning was recorded for on that day",
    # runs (cox_run; cox_turn_end goes on with a run or ends it)
    "run": "JSON of the session's run ({state: running|ended, confirm, unattended, max_turns, turns, outcome?, "
           "last?}); absent for a chat",
    "shares": "JSON {principal: reader|approver} of those the session is shared with; absent when none",
})
"""The fields of the session hash (:func:`session`), each with what it holds. Every value is a
string. The Lua library writes most of them; the runner adds ``plan``, ``mcp`` and ``usage_*``
through ``cox_emit``'s ops. tests/fast/test_contract.py checks that every field the Lua or the
Python reads or writes by name is here, and that each one here is used."""

# Suffixes of a session's keys (mirrored in the Lua library).
LEASE: Final = ":lease"
PROGRAM_LOCK: Final = ":plock"
"""string: the runner that runs the session's programs (cox_runner.programs), with a TTL it renews
like a lease; a send to the idle session starts its turn on that runner. Never archived: a
session is not archivable while it exists."""
"""string: fencing token of the runner holding the turn; PX = lease TTL; absent = idle."""
QUEUE: Final = ":q"
"""list of queued messages (JSON), FIFO."""
STEER: Final = ":sq"
"""list of steered messages not yet started; they run before :q, in the order they came."""
LEADS: Final = ":leads"
"""hash lead_id -> JSON {lead_id, text, state}; state pending|applied|unapplied."""
LEAD_ORDER: Final = ":leadq"
"""list of pending lead ids in save order."""
CLIENT_IDS: Final = ":cid"
"""hash client_id -> the reply already given (idempotent retries)."""
APPROVALS: Final = ":appr"
"""hash approval_id -> JSON of the approval (pending or resolved)."""
OPEN_CALLS: Final = ":open"
"""hash call_id -> tool name: calls the running turn opened and has not closed yet."""
OUTBOX: Final = ":outbox"
"""list of events (JSON with seq) not yet published to JetStream, oldest first."""
PUBLOCK: Final = ":publock"
"""string: the process draining :outbox right now (PX bounded)."""
PUBHW: Final = ":pubhw"
"""string: the last seq of :outbox handed to the :publock holder (PX bounded, gone with the lock)."""
STANDING: Final = ":standing"
"""set of "always this session" keys (command prefixes, ``write:<path>``)."""
WRITES: Final = ":wip"
"""hash call_id -> JSON {path, tmp, ...}: file writes staged and fenced but not yet recorded as
done. Set under the lease's token right before the rename; whoever ends the turn settles each."""
OBSERVED: Final = ":observed"
"""list of operator !command results waiting to be folded into the next tool result."""
ATTACHMENTS: Final = ":att"
"""hash attachment_id -> JSON {attachment_id, name, media_type, size, sha256, expires}: the
session's uploads (the bytes are in the content-addressed attachments folder). ``expires``
(ms) bounds an upload no message named; a message carries its own copy in ``user.msg``."""
TX: Final = ":tx:"
"""prefix of strings ``<session>:tx:<tx>``, one per transition id: the first reply a function
registered through ``once`` gave for that id (JSON {h: head, o: publish-lock owner}), PX
``TX_KEEP_MS``. A retried call whose reply was lost answers from it instead of running twice."""
TX_KEEP_MS: Final = 60_000
"""How long a transition's reply is kept (mirrored in the Lua library): longer than any retry."""


def use_buckets(n: int) -> None:
    """Set the bucket count of this process (once, at start: :func:`coxswain.service.check_buckets`)."""
    global _buckets
    if n < 1:
        raise ValueError("buckets must be at least 1")
    _buckets = n


def buckets() -> int:
    return _buckets


def bucket(sid: str) -> int:
    """The session's bucket: stable across processes and restarts (crc32, not Python's hash)."""
    return zlib.crc32(sid.encode()) % _buckets


def tag(b: int) -> str:
    """The hash tag of bucket ``b``: every key of the bucket is in one cluster slot."""
    return f"{{b{b}}}"


def session(sid: str) -> str:
    """The session hash; also the base every other session key is derived from."""
    return f"cox:s:{tag(bucket(check_id(sid, 'session id')))}:{sid}"


def leases(b: int) -> str:
    """zset sid -> lease expiry in ms (Redis clock) of bucket ``b``. Takeover scans it."""
    return LEASES_PREFIX + tag(b)


def dirty(b: int) -> str:
    """zset sid -> ms when the session's outbox got events nobody has published yet (bucket ``b``).
    The sweeper's list."""
    return DIRTY_PREFIX + tag(b)


def active(b: int) -> str:
    """zset sid -> ms of the session's last recorded event (bucket ``b``): what the archiver
    scans for sessions idle longer than ``[sessions] idle_days`` (docs/operations.md)."""
    return ACTIVE_PREFIX + tag(b)


def stack_pass(what: str) -> str:
    """string (PX one period): the runner making the stack's ``what`` pass (``claim``: takeover,
    ``sweep``: the outbox sweeper) of the period, set NX by whichever runner comes first; and
    ``<what>:cursor``, in a Redis Cluster the counter its passes take their share of the buckets
    from (:meth:`cox_runner.redis.store.Store.claim`)."""
    return PASS_PREFIX + what


def paused(b: int) -> str:
    """zset sid -> ms when a daily budget paused the session (bucket ``b``): what a config reload
    looks at to resume the sessions whose budget was raised (``cox_budget_resume``)."""
    return PAUSED_PREFIX + tag(b)


ARCHIVED: Final = ("", QUEUE, STEER, LEADS, LEAD_ORDER, CLIENT_IDS, APPROVALS, OPEN_CALLS, STANDING, WRITES,
                   OBSERVED, ATTACHMENTS)
"""The suffixes of the keys an archived session's snapshot holds (``""``: the session hash): every
key of a session but the lease, the outbox and its publish lock, which an archivable session has
empty, and the transition replies (``TX``), which expire on their own and are left to do so. A
new session key must be added here (tests/fast/test_archive_unit.py checks every suffix above)."""


def of(sid: str, suffix: str) -> str:
    return session(sid) + suffix


def tx(sid: str, tx_id: str) -> str:
    """The kept reply of transition ``tx_id`` (in the session's slot: derived from its key)."""
    return session(sid) + TX + tx_id


WS_TAG: Final = "{ws}"
WS_OWNERS: Final = "cox:{ws}:owners"
"""hash: workspace name (relative to the root, ``/``-separated) -> the principal who owns it."""
WS_NAMES: Final = "cox:{ws}:names"
"""zset of every workspace name, score 0 (lex order): the names beneath one are a range."""


def ws_principal(name: str) -> str:
    """zset workspace name -> claimed ms: the workspaces ``name`` owns (for its listing)."""
    return f"cox:{WS_TAG}:p:{check_id(name, 'principal')}"


RUNS_TAG: Final = "{runs}"
RUN_SLOTS: Final = "cox:{runs}:slots"
"""zset ``runner|sid|token`` -> lease expiry ms: the run turns driven now, at most ``[runs]
max_active`` (``cox_run_slots``). A slot lapses unless its holder renews it, like a session lease."""
RUN_POLLERS: Final = "cox:{runs}:pollers"
"""zset runner -> expiry ms: the runners with run turns waiting for a slot (each gets its share)."""


def runs_of(name: str) -> str:
    """zset sid -> created ms: the runs one principal started (``GET /v1/runs``). Written before
    the run's session is created, like :func:`principal`."""
    return f"cox:runs:{check_id(name, 'principal')}"


def shared_with(name: str) -> str:
    """zset sid -> shared ms: the sessions shared with one principal. Written before the share
    is recorded (another slot) and cleaned after an unshare; listing checks each session's own
    ``shares`` field, which is the truth."""
    return f"cox:p:{check_id(name, 'principal')}:shared"


RUN_CLIENT_ID_KEEP_MS: Final = 30 * 24 * 3600 * 1000
"""How long a run's ``client_id`` is remembered (from the first ``POST /v1/runs`` that used it)."""


def run_client_id(name: str, client_id: str) -> str:
    """string -> the sid reserved for the run ``name`` asked for with ``client_id`` (``POST
    /v1/runs``), set NX before the run's session is made (its own call: another slot), PX
    :data:`RUN_CLIENT_ID_KEEP_MS`. Two requests with one ``client_id`` get one sid, and making a
    session whose sid exists is refused, so they make one run between them."""
    return f"cox:runs:cid:{check_id(name, 'principal')}:{check_id(client_id, 'client_id')}"


def principal(name: str) -> str:
    """zset sid -> created ms: the sessions one principal owns. Written before the session is
    created (its own call: another slot); an entry without a session is skipped when listed."""
    return f"cox:p:{check_id(name, 'principal')}"


def principal_spend(name: str) -> str:
    """hash ``{day, usd}``: what one principal's sessions cost on the UTC day ``day`` (Redis clock),
    against ``[limits] principal_spend`` (``cox_spend``). Its own hash tag (the principal's name),
    so a call's transition reply (``TX``) is in its slot."""
    return f"cox:p:{{{check_id(name, 'principal')}}}:spend"
