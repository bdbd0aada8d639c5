"""Typed settings, read once per process: flags > environment > TOML file > defaults.

The TOML file is the one docs/api.md describes under Configuration (``[approval]``, ``[judge]``, ``[limits]``,
``[limits.soft]``, ``[lead]``, ``[model]``) plus a few operational tables (``[runner]``,
``[auth]``, ``[[model.providers]]``). Environment variables use the ``COX_`` prefix with ``__``
between levels (``COX_LIMITS__TOOL_CALLS=50``); ``NATS_URL`` and ``REDIS_URL`` are honoured too.
``cox up`` hands its flags to the services it starts through the same variables.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from coxswain.hookspec import HookEventName, HookMatcher

from .notify import NAME_RE as NOTIFY_NAME_RE
from .notify import NotifyEvent
from .notify import default_name as notify_default_name

CONFIG_ENV = "COX_CONFIG"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ApprovalConfig(_Section):
    writes: Literal["allow", "ask"] = "allow"
    commands: Literal["judge", "ask", "allow"] = "judge"
    allow_commands: list[str] = Field(default_factory=list)
    timeout_s: float = Field(0.0, ge=0)
    """An approval nobody answers in this many seconds is declined (actor ``timeout``) and the
    turn goes on; 0: it waits until answered, the turn is stopped or it ends."""
    link_ttl_s: float = Field(3600.0, ge=0)
    """How long an approval's answer link (``answer_url``) is good for from the approval's
    opening; 0: approvals carry no link."""


class JudgeConfig(_Section):
    kind: Literal["rules", "model", "none"] = "rules"
    model: str | None = None
    approve_threshold: float = Field(0.8, ge=0.0, le=1.0)
    timeout_s: float = Field(20.0, gt=0)


class SoftLimits(_Section):
    tool_calls: int | None = Field(None, ge=1)
    tokens: int | None = Field(None, ge=1)
    actions: int | None = Field(None, ge=1)
    seconds: float | None = Field(None, gt=0)
    spend: float | None = Field(None, gt=0)


class LimitsConfig(_Section):
    tool_calls: int = Field(500, ge=1)
    tokens: int = Field(10_000_000, ge=1)
    actions: int = Field(200, ge=1)
    seconds: float = Field(14_400, gt=0)
    """Seconds of work; time spent waiting for the person to answer an approval does not count."""
    spend: float | None = Field(None, gt=0)
    """Cost of one turn's model requests in USD (none: no spend limit). See ``ProviderConfig``."""
    session_spend: float | None = Field(None, gt=0)
    """USD one session may spend per day (UTC; every model request counts: turns, titles, the
    judge, compactions). Reached: the turn ends ``spend_limit`` and the session pauses (its queue
    waits, sends are 409 ``budget_reached``) until an admin raises it (PATCH ``spend_limit``, or
    this key and a reload) or the day ends. None: no daily session budget."""
    principal_spend: float | None = Field(None, gt=0)
    """USD all of one principal's sessions may spend per day, together; reached, each of its
    sessions pauses as :attr:`session_spend` does. None: no daily principal budget."""
    soft: SoftLimits = Field(default_factory=SoftLimits)
    stuck_repeats: int = Field(3, ge=2)
    """How many times the same call with the same result counts as stuck (progress guard)."""
    warn_at: float = Field(0.8, gt=0.0, le=1.0)
    """A ``limit.warning`` is recorded (once per limit and turn) when a hard limit's value reaches
    this fraction of it."""
    compact_at: float = Field(0.8, gt=0.0, le=1.0)
    """The transcript is compacted when a request's input reaches this fraction of the model's
    context window."""

    def hard_value(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else float(value)

    def soft_value(self, name: str) -> float | None:
        """A soft limit follows its hard one unless set lower (so no checkpoint interrupts by default); a spend limit may be soft only."""
        hard = self.hard_value(name)
        soft = getattr(self.soft, name)
        if soft is None:
            return hard
        return float(soft) if hard is None else min(hard, float(soft))


class LeadConfig(_Section):
    max_pending: int = Field(8, ge=1, le=64)
    max_bytes: int = Field(32_768, ge=1)


class AttachmentsConfig(_Section):
    """Files a person attaches to a message (``POST /v1/sessions/{sid}/attachments``)."""

    max_mb: float = Field(20.0, gt=0, le=1024)
    """The largest attachment in MiB; a larger upload is 413 ``too_large`` and nothing is kept."""
    allowed_types: list[str] = Field(default_factory=lambda: ["image/*", "text/*", "application/json",
                                                              "application/pdf", "application/octet-stream"])
    """Media types an attachment may have: exact (``application/pdf``) or a family (``image/*``)."""
    ttl_s: int = Field(86_400, ge=60)
    """An upload no message has referenced within this many seconds expires; its bytes are
    removed once no message named them and this long (and ``collect_grace_s``) passed."""
    collect_every_s: float = Field(600.0, gt=0)
    """How often each turn-runner looks for attachment bytes to remove (:func:`coxswain.attachments.collect`)."""

    def allows(self, media_type: str) -> bool:
        family = media_type.split("/", 1)[0] + "/*"
        return any(t in (media_type, family) for t in self.allowed_types)


class ProviderConfig(_Section):
    """A real model reached through pydantic-ai. ``name`` is what sessions choose.

    ``kind = "script"`` names the built-in script model under another name (with its own prices,
    for spend tests and demos). Prices are USD per million tokens; when unset the cost comes from
    pydantic-ai's price data (genai-prices) for models it knows, else it counts as zero.
    """

    name: str
    kind: Literal["openai", "anthropic", "script"] = "openai"
    model: str = ""
    base_url: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    input_price: float | None = Field(None, ge=0)
    output_price: float | None = Field(None, ge=0)
    cache_read_price: float | None = Field(None, ge=0)
    """USD per million input tokens read from the prompt cache (unset: ``input_price``)."""
    cache_write_price: float | None = Field(None, ge=0)
    """USD per million input tokens written to the prompt cache (unset: ``input_price``)."""
    context_window: int | None = Field(None, ge=1)
    """The model's context window in tokens (unset: unknown, so never compacted; for
    ``kind = "script"``: ``[model.script] context_window``)."""
    vision: bool | None = None
    """The model takes images (image attachments go to it as image parts). Unset: ``true`` for
    ``kind = "anthropic"`` (every current Claude model does), ``false`` otherwise."""

    def takes_images(self) -> bool:
        return self.vision if self.vision is not None else self.kind == "anthropic"

    def key(self) -> str | None:
        """The API key: given here, else read from the variable ``api_key_env`` names."""
        return self.api_key or (os.environ.get(self.api_key_env) if self.api_key_env else None)


class ScriptModelConfig(_Section):
    """The built-in ``script`` model (``[model.script]``)."""

    context_window: int = Field(200_000, ge=1)
    """The context window it pretends to have, in tokens (compaction is tested against it)."""


class ModelConfig(_Section):
    default: str | None = "script"
    providers: list[ProviderConfig] = Field(default_factory=list)
    retries: int = Field(4, ge=0, le=20)
    """How many times a failed model request is retried (429, 5xx, timeouts, broken connections)."""
    retry_max_s: float = Field(30.0, gt=0)
    """The longest wait before a retry; a provider asking for longer is not retried."""
    compactor: str | None = None
    """The model that summarises a transcript when it is compacted (a provider name or ``script``;
    unset: the session's own model)."""
    script: ScriptModelConfig = Field(default_factory=ScriptModelConfig)

    @model_validator(mode="after")
    def _known_compactor(self) -> ModelConfig:
        if self.compactor is not None and self.compactor not in self.names():
            raise ValueError(f"[model] compactor {self.compactor!r} is not script or a [[model.providers]] name")
        return self

    def names(self) -> set[str]:
        return {"script"} | {p.name for p in self.providers}

    def provider(self, name: str) -> ProviderConfig | None:
        """The ``[[model.providers]]`` entry named ``name`` (None for the built-in script model)."""
        return next((p for p in self.providers if p.name == name), None)

    def context_window(self, name: str) -> int | None:
        """The model's context window in tokens, or None when it is not known."""
        p = self.provider(name)
        if p is None:
            return self.script.context_window if name == "script" else None
        if p.context_window is not None:
            return p.context_window
        return self.script.context_window if p.kind == "script" else None


class RunnerConfig(_Section):
    lease_ms: int = Field(5_000, ge=200)
    """Busy lease TTL. A killed runner's turn is taken over after about this long."""
    renew_ms: int | None = Field(None, ge=50)
    """How often the holder renews (default lease/3)."""
    self_fence: bool = True
    """A drive whose lease could not be renewed stops itself before the lease can lapse (kills
    its command, writes no file). Redis refuses a stale token either way; off only to test that."""
    claim_interval_ms: int = Field(250, ge=20)
    """How often every runner looks for expired leases and stuck outboxes."""
    command_timeout_s: float = Field(120.0, gt=0)
    output_limit: int = Field(64_000, ge=1024)
    """Bytes of tool output given back to the model; the rest is cut with a note."""
    transcripts_kept: int = Field(256, ge=0)
    """Sessions whose transcript a runner keeps when their drive ends, so the next turn there
    reads only the events since instead of the whole log (0: none; the oldest goes first)."""
    infra_wait_s: float = Field(30.0, gt=0)
    """How long a turn waits for guard, judge or versions (or the message bus) to answer again
    before it ends ``unavailable``; Stop and steer end the wait at once."""

    @property
    def renew_every_ms(self) -> int:
        return self.renew_ms or max(50, self.lease_ms // 3)


class SandboxConfig(_Section):
    """Where a command (the model's ``run_command``, a person's ``!command``) runs.

    ``bwrap``: in a bubblewrap sandbox that sees its workspace read-write, the system read-only,
    a private ``/tmp`` and no network (its own network namespace). ``none`` runs commands bare
    as the runner's user; it must be chosen explicitly and is reported loudly. When the sandbox
    cannot start, commands are refused (fail closed), never run bare.
    """

    mode: Literal["bwrap", "none"] = "bwrap"
    network: bool = False
    """Every command may use the network (else only a command the person allowed it for). A
    granted command still has no host network: it reaches the network only through coxswain's
    egress proxy (:mod:`cox_runner.workspace.egress`), which refuses loopback, private, link-local and
    other non-public addresses after resolving the name."""
    allow_hosts: list[str] = Field(default_factory=list)
    """Host patterns a granted command may reach through the proxy (``pypi.org``,
    ``*.pythonhosted.org``: any name under it, not the name itself); empty: any public host."""
    deny_hosts: list[str] = Field(default_factory=list)
    """Host patterns the proxy always refuses (wins over ``allow_hosts``)."""
    allow_networks: list[str] = Field(default_factory=list)
    """Address ranges (CIDR) the proxy may reach although they are not public, e.g. an internal
    package mirror at ``10.20.0.0/16``; never loopback, link-local (cloud metadata),
    unspecified or multicast ranges (a config naming one is refused)."""
    extra_ro: list[Path] = Field(default_factory=list)
    """More host paths a command sees read-only (at the same path)."""
    extra_rw: list[Path] = Field(default_factory=list)
    """More host paths a command may write (at the same path)."""
    bwrap: str = "bwrap"
    """The bubblewrap program: a name looked up in ``PATH``, or a path."""
    user: str = Field(default="cox-sandbox", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    """The unprivileged host user every sandboxed process runs as when the runner is root
    (looked up at start; it must exist and not be root, else commands are refused). The runner's
    and the versions service's writes into a workspace belong to it too. Unused when the runner
    is not root: then commands run as the runner's own user."""
    proc: Literal["own", "none"] = "own"
    """``own``: the command gets a fresh ``/proc`` of its own process namespace. ``none``: an empty
    ``/proc`` (the process namespace stays its own). For a runner in a container whose ``/proc``
    Docker masks (the default; ``systempaths=unconfined`` lifts it, which Compose cannot pass):
    the kernel refuses such a container a fresh ``/proc``."""
    # Resource limits per command, hook and MCP stdio server (cox_runner.workspace.limits; 0 = no limit).
    max_processes: int = Field(1024, ge=0)
    """Processes (and threads) alive at once in one command (the pids cgroup)."""
    memory_mb: int = Field(4096, ge=0)
    """Memory of one command, page cache and its ``/tmp`` included (the memory cgroup)."""
    cpu_seconds: int = Field(3600, ge=0)
    """CPU time of one command, all its processes together (cpuacct; RLIMIT_CPU per process)."""
    file_mb: int = Field(1024, ge=0)
    """The largest file a command may write (RLIMIT_FSIZE)."""
    workspace_mb: int = Field(512, ge=0)
    """What one command may add to the workspace and have versioned: its created and changed
    files past this many MB are not versioned (named in its result)."""
    workspace_files: int = Field(2000, ge=0)
    """How many created, changed or deleted files of one command are versioned; the rest are not
    (named in its result)."""
    max_programs: int = Field(4, ge=0)
    """Programs (``start_program``, a person's ``!&command``) running at once in one session; the
    next one is refused with a result that says so (0: no programs)."""
    program_idle_s: float = Field(1800.0, ge=0)
    """A program nobody read or wrote for this long is stopped (``program.stopped`` by ``idle``;
    0: never)."""

    @field_validator("allow_hosts", "deny_hosts")
    @classmethod
    def _host_patterns(cls, v: list[str]) -> list[str]:
        from .hostpatterns import normalize_pattern

        return [normalize_pattern(p) for p in v]

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        from .hostpatterns import check_network

        return [check_network(n) for n in v]


MCP_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9-]*(?:_[A-Za-z0-9-]+)*$"
"""A server's name: letters, digits, ``-`` and single ``_`` (``__`` joins it to a tool's name)."""


class McpServerConfig(_Section):
    """One MCP tool server (``[[mcp.servers]]``): a stdio ``command`` run in the command sandbox
    with the workspace as its folder, or a streamable HTTP ``url``. Its tools reach the model
    as ``<name>__<tool>``; every call goes through the same gate as ``run_command``."""

    name: str = Field(pattern=MCP_NAME_RE, max_length=40)
    command: list[str] | str | None = None
    """The program and its arguments (a list, or one string split like a shell would)."""
    args: list[str] = Field(default_factory=list)
    """More arguments after ``command``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment for the server beyond the scrubbed one commands get."""
    url: str | None = None
    """A streamable HTTP endpoint (``http(s)://host:port/mcp``); runs outside the sandbox."""
    tools: list[str] | None = None
    """The tools offered to the model (their names on the server); absent: all it lists."""
    read_only: bool = False
    """Every tool of this server only reads: its calls are not actions (allowed without asking,
    not counted against ``[limits] actions``)."""
    read_only_tools: list[str] = Field(default_factory=list)
    """Tools of this server that only read (the others are actions)."""
    enabled: bool = True
    network: bool = False
    """A stdio server's sandbox has the network (else none, like a command's)."""
    timeout_s: float = Field(120.0, gt=0)
    """The longest one call may take (the turn's time left bounds it too)."""
    start_timeout_s: float = Field(30.0, gt=0)
    """How long the server may take to start and list its tools before it counts as failed."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command (stdio) or url (HTTP)")
        if self.command is not None and not self.argv():
            raise ValueError(f"MCP server {self.name!r}: command is empty")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must be http:// or https://")
        return self

    def argv(self) -> list[str]:
        """The stdio server's program and arguments."""
        cmd = self.command
        words = shlex.split(cmd) if isinstance(cmd, str) else list(cmd or [])
        return [*words, *self.args]

    def is_read_only(self, tool: str) -> bool:
        return self.read_only or tool in self.read_only_tools

    def offers(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools


class McpConfig(_Section):
    servers: list[McpServerConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> McpConfig:
        names = [s.name for s in self.servers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"MCP server names must be unique: {', '.join(dup)}")
        return self

    def enabled(self) -> list[McpServerConfig]:
        return [s for s in self.servers if s.enabled]

    def server_of(self, name: str) -> tuple[McpServerConfig, str] | None:
        """The enabled server and tool a model-facing name ``<server>__<tool>`` stands for."""
        server, sep, tool = name.partition("__")
        if not sep or not tool:
            return None
        for s in self.servers:
            if s.enabled and s.name == server:
                return s, tool
        return None


class GatewayConfig(_Section):
    max_streams_per_principal: int = Field(100, ge=1)
    """Event streams (SSE, and JSON reads that wait) one principal may hold open at once; the
    next is refused with 429 ``too_many_streams``."""
    stream_buffer_bytes: int = Field(1_048_576, ge=65_536)
    """Events buffered for one stream's client; a client that falls further behind is dropped
    (its stream closed; it resumes with ``after`` or ``Last-Event-ID``)."""
    stream_stall_s: float = Field(10.0, gt=0)
    """A stream whose client has not taken one write for this long is dropped too."""
    keep_alive_s: int = Field(75, ge=1)
    """An idle HTTP/1.1 connection is kept this long for the client's next request: longer than
    common clients keep a pooled connection idle (httpx, so the ``cox`` CLI too: 5 s), so the
    client, never the server, closes it; equal timers race, and a request sent as the server
    closes its socket is reset unread. Behind a load balancer keep it above the balancer's idle
    timeout."""
    public_url: str = Field("", pattern=r"^(https?://[^\s/?#]+(/[^\s?#]*)?)?$")
    """The gateway's address as a person's phone reaches it (``https://cox.example.org``): the
    base of approvals' answer links. Empty: a link is the path on the gateway (``/answer/...``)."""


class VersionsConfig(_Section):
    """The retention policy of every workspace's versions store (see docs/operations.md#retention).

    A version is kept while it is younger than ``keep_days`` OR among the newest
    ``keep_per_file`` versions of its file; only a version outside both is collected. 0 means no
    limit for that rule, so either one at 0 keeps everything.
    """

    keep_days: float = Field(30.0, ge=0)
    keep_per_file: int = Field(20, ge=0)
    gc_interval_s: float = Field(3600.0, gt=0)
    """How often the versions service collects every workspace under the root (and once at start)."""
    fork_max_files: int = Field(200_000, ge=1)
    """A fork copies at most this many files, folders and links; a bigger workspace is refused
    (413 ``too_large``) and nothing is left behind."""
    fork_max_mb: int = Field(4096, ge=1)
    """A fork copies at most this many MiB of file content."""


class RedisConfig(_Section):
    """How coxswain uses Redis (the URL and credentials are top-level: ``COX_REDIS_URL`` ...)."""

    cluster: bool = False
    """``COX_REDIS_URL`` names one node of a Redis Cluster: connect with the cluster client (it
    finds every other node). Off: one Redis server (the default)."""
    buckets: int = Field(256, ge=1, le=16384)
    """Sessions hash into this many buckets; a bucket's keys share one cluster slot. Fixed at
    first start (kept in Redis as ``cox:meta``): a process configured otherwise refuses to start."""
    wait_replicas: int = Field(0, ge=0)
    """After each acknowledged transition (a 202 of the API, a turn's end, a takeover) wait until
    this many replicas hold it (``WAIT``); when fewer answer within ``wait_ms`` the API answers
    503. 0: no waiting (one server without replicas)."""
    wait_ms: int = Field(1000, ge=1)
    """How long a transition waits for its replicas."""


class HooksConfig(_Section):
    """Hooks in the Claude Code ``hooks.json`` shape (docs/api.md, "Hooks"): commands run at
    ``PreToolUse``, ``PostToolUse``, ``UserPromptSubmit``, ``Stop`` and ``PreCompact``, inside the
    command sandbox, fail-closed."""

    enabled: bool = True
    """Off: no hook runs (neither config's nor the workspace's)."""
    workspace: bool = True
    """Read the workspace's ``<store_dir>/hooks.json`` (protected: the model cannot write it)."""
    file: Path | None = None
    """A ``hooks.json`` on the runner's host whose hooks run for every session (before the
    workspace's). Its commands still run in the sandbox: a script they call must be inside the
    workspace or under ``[sandbox] extra_ro``."""
    inline: dict[HookEventName, list[HookMatcher]] = Field(default_factory=dict)
    """Hooks written in the config itself: ``[[hooks.inline.PreToolUse]]`` tables with ``matcher``
    and ``hooks = [{type = "command", command = "...", timeout = 30}]``."""
    timeout_s: float = Field(30.0, gt=0, le=3600)
    """A hook's time limit when it sets no ``timeout`` of its own; past it the hook is killed and
    fails closed."""
    max_stop_continues: int = Field(3, ge=0, le=100)
    """How many times ``Stop`` hooks may continue one turn (each through a Lead); then the turn ends."""


class NatsConfig(_Section):
    """How coxswain uses NATS (the URL and credentials are top-level: ``COX_NATS_URL`` ...)."""

    stream_replicas: int = Field(1, ge=1, le=5)
    """Replicas of the JetStream event stream (``num_replicas``): 1 on one server, 3 on a cluster of
    three nodes (each event is then on a quorum of nodes before its publish is acknowledged, and
    the stream survives the loss of one node). The turn-runner creates the stream with it, or
    updates an existing stream to it at start; a count the cluster cannot place (more than its
    JetStream nodes) stops the runner with the server's error."""


class SessionsConfig(_Section):
    """Idle sessions (docs/operations.md, "Idle sessions")."""

    idle_days: float = Field(0.0, ge=0)
    """A session that recorded nothing for this long (nothing running, queued, pending or
    unpublished) has its Redis keys saved to the archive (JetStream KV ``COX_ARCHIVE``) and
    dropped; its next change loads it back. Fractions of a day are allowed. 0: never archive."""
    archive_every_s: float = Field(60.0, gt=0)
    """How often each turn-runner looks for idle sessions (a share of the buckets a pass, like the
    sweeper in a cluster)."""


class RunsConfig(_Section):
    """Runs: sessions whose turns the program drives (docs/api.md, "Runs"; docs/design.md, "Runs")."""

    max_active: int = Field(8, ge=1, le=100_000)
    """Run turns the whole stack drives at once (a semaphore in Redis, its slots leased and
    renewed like the session leases). A run turn over the bound waits, queued, for a slot; an
    interactive turn never waits for one."""


class ShareConfig(_Section):
    """One ``[[auth.shares]]`` entry: a workspace its owner shares with other principals."""

    workspace: str = Field(min_length=1, max_length=4096)
    """The workspace's name: its folder relative to the root (``team/app``)."""
    principals: list[str] = Field(min_length=1)
    """Who may open sessions on it besides its owner (and see it in ``GET /v1/workspaces``)."""

    @field_validator("workspace")
    @classmethod
    def _relative(cls, v: str) -> str:
        name = posixpath.normpath(v.strip())
        if name.startswith("/") or name in (".", "..") or name.startswith("../"):
            raise ValueError(f"[[auth.shares]] workspace must be a folder under the root, not {v!r}")
        return name


class AuthConfig(_Section):
    tokens: dict[str, str] = Field(default_factory=dict)
    """Bearer token -> principal name, for more than the one local principal."""
    shares: list[ShareConfig] = Field(default_factory=list)
    """Workspaces shared with principals other than their owner (docs/api.md, "Workspaces")."""
    roles: dict[str, Literal["reader", "member", "admin"]] = Field(default_factory=dict)
    """Principal -> role (docs/api.md, "Roles and sharing"); a principal without one is a ``member``."""

    def role_of(self, principal: str) -> str:
        return self.roles.get(principal, "member")

    def shared_with(self, principal: str) -> set[str]:
        """The workspace names shared with ``principal``."""
        return {s.workspace for s in self.shares if principal in s.principals}


class WebhookConfig(_Section):
    """One ``[[notify.webhooks]]`` entry: where chosen events are posted, signed with its secret.

    The secret is given here or, better, named by ``secret_env`` (an environment variable of the
    gateway); it signs each delivery (:func:`coxswain.notify.sign`) and is never logged or shown.
    """

    url: str = Field(pattern=r"^https?://")
    events: list[NotifyEvent] = Field(min_length=1)
    secret: SecretStr | None = None
    secret_env: str | None = None
    name: str | None = Field(None, pattern=NOTIFY_NAME_RE.pattern)
    """Names its deliveries (``X-Cox-Delivery``), metrics and JetStream consumer; unset: derived
    from the URL (``wh-`` and 12 hex digits of its SHA-256)."""

    @model_validator(mode="after")
    def _one_secret(self) -> WebhookConfig:
        if (self.secret is None) == (self.secret_env is None):
            raise ValueError("a [[notify.webhooks]] entry needs exactly one of secret and secret_env")
        if self.name is None:
            self.name = notify_default_name(self.url)
        return self

    @property
    def label(self) -> str:
        """The webhook's name (given or derived)."""
        return self.name or notify_default_name(self.url)

    def key(self) -> str | None:
        """The signing secret: given here, else read from the variable ``secret_env`` names."""
        if self.secret is not None:
            return self.secret.get_secret_value()
        return os.environ.get(self.secret_env) if self.secret_env else None


class NotifyConfig(_Section):
    """``[notify]``: webhooks, and how their deliveries are retried (the gateway delivers them)."""

    webhooks: list[WebhookConfig] = Field(default_factory=list)
    max_attempts: int = Field(8, ge=1, le=100)
    """Attempts of one event to one webhook before it is given up (counted and logged)."""
    max_age_s: float = Field(86_400.0, gt=0)
    """An event older than this (from when it was recorded) is given up rather than tried again."""
    backoff_s: float = Field(1.0, gt=0)
    """The wait after the first failed attempt; it doubles after each one, up to ``backoff_max_s``."""
    backoff_max_s: float = Field(300.0, gt=0)
    timeout_s: float = Field(10.0, gt=0, le=300)
    """One attempt's HTTP time-out (connect, send and answer)."""
    concurrency: int = Field(8, ge=1, le=256)
    """Deliveries one gateway has in flight per webhook at once."""

    @model_validator(mode="after")
    def _unique_names(self) -> NotifyConfig:
        names = [w.label for w in self.webhooks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"[[notify.webhooks]] names must differ: {twice}")
        return self


class TelemetryConfig(_Section):
    """``[telemetry]``: traces of turns, exported by OTLP/HTTP (the gateway exports them from the
    event log; docs/operations.md, "Traces")."""

    otlp_endpoint: str = ""
    """The collector's OTLP/HTTP base URL (``http://127.0.0.1:4318``): spans are posted to
    ``<otlp_endpoint>/v1/traces`` (a URL that already ends so is used as it is). Empty: no
    traces (the default)."""
    timeout_s: float = Field(10.0, gt=0, le=120)
    """One export's time-out (the exporter's own retries included); a turn whose export fails
    is tried again later."""
    service_name: str = Field("coxswain", min_length=1, max_length=200)
    """The spans' ``service.name`` resource attribute."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, v: str) -> str:
        v = v.strip()
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("[telemetry] otlp_endpoint must be an http:// or https:// URL (OTLP/HTTP)")
        return v

    def traces_url(self) -> str:
        """Where spans are posted ('' when traces are off)."""
        if not self.otlp_endpoint:
            return ""
        base = self.otlp_endpoint.rstrip("/")
        return base if base.endswith("/v1/traces") else base + "/v1/traces"


class Settings(BaseSettings):
    """Everything a coxswain process reads at start."""

    model_config = SettingsConfigDict(env_prefix="COX_", env_nested_delimiter="__", extra="ignore")

    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias=AliasChoices("COX_NATS_URL", "NATS_URL"))
    """One NATS server, or every node of a NATS cluster comma-separated
    (``nats://n1:4222,nats://n2:4222,nats://n3:4222``); clients reconnect to any of them."""
    redis_url: str = Field("redis://127.0.0.1:6379/0", validation_alias=AliasChoices("COX_REDIS_URL", "REDIS_URL"))
    # This process's user on each server (``cox up`` gives every service its own); unset: the
    # URL's ``user:pass@``, if any. Never logged: URLs are redacted, passwords are SecretStr.
    nats_user: str | None = Field(None, validation_alias=AliasChoices("COX_NATS_USER", "NATS_USER"))
    nats_password: SecretStr | None = Field(None, validation_alias=AliasChoices("COX_NATS_PASSWORD", "NATS_PASSWORD"))
    redis_user: str | None = Field(None, validation_alias=AliasChoices("COX_REDIS_USER", "REDIS_USER"))
    redis_password: SecretStr | None = Field(None, validation_alias=AliasChoices("COX_REDIS_PASSWORD", "REDIS_PASSWORD"))
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    """The bearer token of the local principal (``cox up --token`` or ``.cox/token``)."""
    principal: str = "local"
    root: Path = Path("workspaces")
    """Workspaces may only be created under this folder."""
    store_dir: str = ".coxswain"
    """The versions store inside each workspace (protected, ignored by git)."""
    max_body: int = 1_048_576
    instance: str = ""
    """A name for this process in logs (cox up sets gateway, turn-runner-1, ...)."""
    log_level: str = "info"
    loop_stall_ms: int = Field(1000, ge=0)
    """Log ``loop.stalled`` (how long, and where) when one step holds the event loop longer; 0: off."""

    approval: ApprovalConfig = Field(default_factory=ApprovalConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    lead: LeadConfig = Field(default_factory=LeadConfig)
    attachments: AttachmentsConfig = Field(default_factory=AttachmentsConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    versions: VersionsConfig = Field(default_factory=VersionsConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    nats: NatsConfig = Field(default_factory=NatsConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    hooks: HooksConfig = Field(default_factory=HooksConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    runs: RunsConfig = Field(default_factory=RunsConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @model_validator(mode="after")
    def _absolute_root(self) -> Settings:
        self.root = self.root.expanduser().resolve()
        return self

    def principals(self) -> dict[str, str]:
        """Token -> principal, including the local one."""
        out = dict(self.auth.tokens)
        if self.token:
            out[self.token] = self.principal
        return out

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = os.environ.get(CONFIG_ENV)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(path)))
        return tuple(sources)


def load(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Read settings once. ``config`` (or ``$COX_CONFIG``) names the TOML file; it must exist."""
    if config is not None:
        os.environ[CONFIG_ENV] = str(config)
    path = os.environ.get(CONFIG_ENV)
    if path and not Path(path).is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
