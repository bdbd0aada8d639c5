"""Redis key layout. Every key is owned by a session (deleted with it) or is a small global index.

All of a session's keys share the hash tag ``{sid}`` so they land in one cluster slot and one
Lua call can touch them together. The Lua library (``cox_runner/redis_lib.lua``) derives the
suffixed keys from the session key, so the suffixes below are mirrored there: change both.
"""

from __future__ import annotations

from typing import Final

from .ids import check_id

PREFIX: Final = "cox"

# Global indexes (small, one entry per session at most).
LEASES: Final = "cox:leases"
"""zset sid -> lease expiry in ms (Redis clock). Takeover scans it for expired leases."""
DIRTY: Final = "cox:outbox:dirty"
"""zset sid -> ms when its outbox last got events nobody has published yet. The sweeper's list."""
VERSIONS_MAC_KEY: Final = "cox:versions:mac-key"
"""string: the versions service's HMAC key (hex). Index lines in a workspace's store folder are
members only with a valid MAC; the key lives here, out of reach of the model's commands."""

# Suffixes of a session's keys (mirrored in the Lua library).
LEASE: Final = ":lease"
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
STANDING: Final = ":standing"
"""set of "always this session" keys (command prefixes, ``write:<path>``)."""
WRITES: Final = ":wip"
"""hash call_id -> JSON {path, tmp, ...}: file writes staged and fenced but not yet recorded as
done. Set under the lease's token right before the rename; whoever ends the turn settles each."""
OBSERVED: Final = ":observed"
"""list of operator !command results waiting to be folded into the next tool result."""
TX: Final = ":tx:"
"""prefix of strings ``<session>:tx:<tx>``, one per transition id: the first reply a function
registered through ``once`` gave for that id (JSON {h: head, o: publish-lock owner}), PX
``TX_KEEP_MS``. A retried call whose reply was lost answers from it instead of running twice."""
TX_KEEP_MS: Final = 60_000
"""How long a transition's reply is kept (mirrored in the Lua library): longer than any retry."""


def session(sid: str) -> str:
    """The session hash; also the base every other session key is derived from."""
    return f"cox:s:{{{check_id(sid, 'session id')}}}"


def of(sid: str, suffix: str) -> str:
    return session(sid) + suffix


def tx(sid: str, tx_id: str) -> str:
    """The kept reply of transition ``tx_id`` (in the session's slot: derived from its key)."""
    return session(sid) + TX + tx_id


def principal(name: str) -> str:
    """zset sid -> created ms: the sessions one principal owns."""
    return f"cox:p:{check_id(name, 'principal')}"
