"""The egress proxy: the only way a command granted the network reaches it.

A granted command keeps its own network namespace (bubblewrap's ``--unshare-net``: a loopback
and nothing else), so it reaches neither the host's loopback (the stack's Redis and NATS) nor
any other address by itself. Its traffic goes through this proxy instead, as Anthropic's
sandbox-runtime does on Linux:

- for each command, :meth:`Egress.grant` opens a Unix socket in a private (0700) folder of its
  own and serves HTTP (``CONNECT host:port`` and absolute-form ``GET http://...``) and SOCKS5
  (``CONNECT``, names resolved here: ``socks5h``) on it, telling the two apart by the first byte;
- :mod:`cox_runner.workspace.sandbox` binds that socket (only it) into the sandbox at :data:`SOCKET_IN_SANDBOX`
  and starts the command through :data:`FORWARDER`, a small script of the system's python3
  that listens on ``127.0.0.1:``:data:`PORT` in the sandbox's own namespace, forks itself off
  as a forwarder to the socket and execs the command; ``HTTP(S)_PROXY``/``ALL_PROXY`` (and the
  lowercase forms) point there, ``NO_PROXY`` keeps the sandbox's own loopback direct;
- the proxy resolves the name itself (the sandbox has no DNS), judges every address it got
  (:func:`coxswain.hostpatterns.address_refusal`: loopback, private, CGNAT, link-local and so
  cloud metadata, ULA, multicast, unspecified, IPv4 carried in IPv6, ...) and connects only to
  an address it judged (so a second answer of the name server cannot swap it: DNS rebinding);
  ``[sandbox] allow_hosts``/``deny_hosts`` judge the name first;
- every connection allowed or refused is a :class:`Request`, which the caller records as a
  ``network.request`` event with the command's result.

Bounded: :data:`MAX_OPEN` connections of one command at once, :data:`MAX_CONNECTIONS` in all
(past it the command's socket stops answering, so the log records at most that many), a request head
of :data:`HEAD_LIMIT` bytes within :data:`HANDSHAKE_S`, resolution and connection time-outs,
:data:`IDLE_S` without a byte either way closes a tunnel; each direction copies through
asyncio's bounded buffers (a slow reader pauses the other side).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from coxswain import events as ev
from coxswain import hostpatterns
from coxswain.config import SandboxConfig

PORT = 3128
"""Where the forwarder listens inside the sandbox (its own namespace: no clash with the host)."""
SOCKET_IN_SANDBOX = "/run/cox-egress.sock"
PROXY_URL = f"http://127.0.0.1:{PORT}"
SOCKS_URL = f"socks5h://127.0.0.1:{PORT}"
NO_PROXY = "localhost,127.0.0.1,::1"
MAX_OPEN = 32
"""Connections of one command open at once; more are refused."""
MAX_CONNECTIONS = 512
"""Connections one command may ask for in all (each is an event); past it its socket closes."""
HEAD_LIMIT = 16384
HANDSHAKE_S = 10.0
RESOLVE_S = 10.0
CONNECT_S = 10.0
IDLE_S = 300.0
CHUNK = 65536
PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
"""Where the forwarder's interpreter is looked for: inside the system folders the sandbox sees."""

FORWARDER = r"""
import os, socket, sys, threading
path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(64)
if os.fork():
    srv.close()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"{argv[0]}: {e.strerror}\n")
        os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(c):
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        u.connect(path)
    except OSError:
        c.close()
        return
    t = threading.Thread(target=pipe, args=(u, c), daemon=True)
    t.start()
    pipe(c, u)
    t.join()
    c.close()
    u.close()
while True:
    try:
        c, _ = srv.accept()
    except OSError:
        continue
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
"""Runs as the sandbox's first process (``python3 -I -S -c FORWARDER <socket> <port> -- argv``):
binds before the command starts (no race), forks, the parent execs the command (so its exit
code is bwrap's), the child forwards; the child dies with the sandbox's process namespace when
the command exits. Same user, same namespaces, same limits as the command."""


def forwarder_python() -> str | None:
    for p in PYTHONS:
        if os.access(p, os.X_OK):
            return p
    return None


def sandbox_env() -> dict[str, str]:
    """The proxy variables of a granted command's environment."""
    env = {"HTTP_PROXY": PROXY_URL, "HTTPS_PROXY": PROXY_URL, "ALL_PROXY": SOCKS_URL, "NO_PROXY": NO_PROXY}
    return {**env, **{k.lower(): v for k, v in env.items()}}


def bwrap_args(sock: str) -> list[str]:
    """The bwrap arguments that give a sandbox the proxy: the socket (only it) and the variables."""
    args = ["--ro-bind", sock, SOCKET_IN_SANDBOX]
    for k, v in sandbox_env().items():
        args += ["--setenv", k, v]
    return args


def wrapped(python: str, argv: list[str]) -> list[str]:
    """``argv`` started through the forwarder (inside the sandbox)."""
    return [python, "-I", "-S", "-c", FORWARDER, SOCKET_IN_SANDBOX, str(PORT), "--", *argv]


@dataclass
class Request:
    """One connection asked for: what a ``network.request`` event records."""

    host: str
    port: int
    allowed: bool
    reason: str
    address: str | None = None


def network_events(base: dict[str, Any], requests: list[Request], call_id: str | None,
                   server: str | None = None) -> list[ev._Event]:
    """The ``network.request`` events of what a command asked the proxy for (taken off the list)."""
    out: list[ev._Event] = [ev.NetworkRequest(**base, host=r.host[:300], port=r.port, allowed=r.allowed,
                                              reason=r.reason[:500], address=r.address, call_id=call_id,
                                              server=server) for r in requests]
    requests.clear()
    return out


@dataclass
class Decision:
    allowed: bool
    reason: str
    addresses: list[str] = field(default_factory=list)
    """Allowed: the judged addresses to try in order. Refused: the address refused, if any."""


Resolver = Callable[[str, int], Awaitable[list[str]]]
Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for info in infos:
        addr = str(info[4][0]).split("%")[0]
        if addr not in seen:
            seen.append(addr)
    return seen


async def _connect(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(address, port, limit=CHUNK)


class Refused(Exception):
    """A request the proxy answers with a refusal (or a malformed one)."""


@dataclass
class Grant:
    """One command's proxy: its socket and what it was asked for."""

    socket: str
    requests: list[Request]
    total: int = 0
    open: int = 0
    server: asyncio.AbstractServer | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class Egress:
    """The runner's egress proxy (one per runner; one socket per granted command)."""

    def __init__(self, cfg: SandboxConfig, *, resolve: Resolver | None = None, connect: Connector | None = None,
                 max_connections: int = MAX_CONNECTIONS, idle_s: float = IDLE_S) -> None:
        self.cfg = cfg
        self.resolve = resolve or _resolve
        self.connect = connect or _connect
        self.max_connections = max_connections
        self.idle_s = idle_s
        self.sandbox_uid: int | None = None
        """When the sandbox runs as another host user (a root runner drops to one), its uid: the
        socket and its folder are then that user's (still 0700: no other user reaches them)."""

    async def decide(self, host: str, port: int) -> Decision:
        """Judge a request: the name by the patterns, then every address it resolves to."""
        name = hostpatterns.normalize_host(host)
        if name is None:
            return Decision(False, "not a valid host name")
        if not 0 < port < 65536:
            return Decision(False, "not a valid port")
        why = hostpatterns.host_refusal(name, self.cfg.allow_hosts, self.cfg.deny_hosts)
        if why:
            return Decision(False, why)
        try:
            addresses = [str(ipaddress.ip_address(name))]
        except ValueError:
            try:
                addresses = await asyncio.wait_for(self.resolve(name, port), RESOLVE_S)
            except (OSError, TimeoutError, UnicodeError) as exc:
                return Decision(False, f"{name} did not resolve ({type(exc).__name__})")
        ok: list[str] = []
        first_refused: tuple[str, str] | None = None
        for a in addresses:
            try:
                why = hostpatterns.address_refusal(a, self.cfg.allow_networks)
            except ValueError:
                why = "not an IP address"
            if why is None:
                ok.append(a)
            elif first_refused is None:
                first_refused = (a, why)
        if not ok:
            if first_refused is None:
                return Decision(False, f"{name} did not resolve")
            a, why = first_refused
            said = why if a == name else f"{name} resolves to {a}, {why}"
            return Decision(False, said, [a])
        if hostpatterns.address_refusal(ok[0]) is not None:
            why = f"{ok[0]} is in allow_networks"
        else:
            why = "a public address"
        return Decision(True, f"{name} is in allow_hosts, {why}" if self.cfg.allow_hosts else why, ok)

    @contextlib.asynccontextmanager
    async def grant(self, requests: list[Request]) -> AsyncIterator[Grant]:
        """A proxy socket for one command, closed (every tunnel with it) when the block ends."""
        folder = tempfile.mkdtemp(prefix="cox-egress-")  # 0700
        path = os.path.join(folder, "proxy.sock")
        g = Grant(path, requests)
        try:
            g.server = await asyncio.start_unix_server(lambda r, w: self._accept(g, r, w), path=path,
                                                       limit=HEAD_LIMIT)
            os.chmod(path, 0o600)
            if self.sandbox_uid is not None:
                os.chown(path, self.sandbox_uid, -1)
                os.chown(folder, self.sandbox_uid, -1)
            yield g
        finally:
            if g.server is not None:
                g.server.close()
            for t in list(g.tasks):
                t.cancel()
            if g.tasks:
                await asyncio.wait(g.tasks, timeout=2)
            shutil.rmtree(folder, ignore_errors=True)

    def _accept(self, g: Grant, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._handle(g, reader, writer))
        g.tasks.add(task)
        task.add_done_callback(g.tasks.discard)

    async def _handle(self, g: Grant, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        g.total += 1
        if g.total >= self.max_connections and g.server is not None:
            g.server.close()  # the last one it answers: the command's socket stops answering
        g.open += 1
        try:
            await self._serve(g, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, Refused):
            pass
        finally:
            g.open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2)

    async def _serve(self, g: Grant, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await asyncio.wait_for(reader.readexactly(1), HANDSHAKE_S)
        socks = first == b"\x05"
        if socks:
            host, port = await asyncio.wait_for(_socks_request(reader, writer), HANDSHAKE_S)
            head = b""
        else:
            host, port, head = await asyncio.wait_for(_http_request(first, reader, writer), HANDSHAKE_S)
        if g.open > MAX_OPEN:
            d = Decision(False, f"the command has {MAX_OPEN} connections open already")
        else:
            d = await self.decide(host, port)
        if not d.allowed:
            g.requests.append(Request(host, port, False, d.reason, d.addresses[0] if d.addresses else None))
            await _refuse(writer, socks, 0x02, 403, d.reason)
            return
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        failure = ""
        for a in d.addresses:
            try:
                upstream = await asyncio.wait_for(self.connect(a, port), CONNECT_S)
                address = a
                break
            except (OSError, TimeoutError) as exc:
                failure = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        if upstream is None:
            g.requests.append(Request(host, port, True, f"{d.reason}; the connection failed: {failure}",
                                      d.addresses[0]))
            await _refuse(writer, socks, 0x05, 502, f"the connection to {host}:{port} failed: {failure}")
            return
        g.requests.append(Request(host, port, True, d.reason, address))
        up_r, up_w = upstream
        try:
            if socks:
                writer.write(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")
            elif head:
                up_w.write(head)
            else:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await self._pipe_both(reader, writer, up_r, up_w)
        finally:
            up_w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(up_w.wait_closed(), 2)

    async def _pipe_both(self, a_r: asyncio.StreamReader, a_w: asyncio.StreamWriter,
                         b_r: asyncio.StreamReader, b_w: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        last = [loop.time()]
        idle = self.idle_s

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while True:
                try:
                    data = await asyncio.wait_for(src.read(CHUNK), min(idle, 30.0))
                except TimeoutError:
                    if loop.time() - last[0] >= idle:
                        raise
                    continue
                if not data:
                    if dst.can_write_eof():
                        with contextlib.suppress(OSError):
                            dst.write_eof()
                    return
                last[0] = loop.time()
                dst.write(data)
                await dst.drain()

        tasks = [asyncio.ensure_future(copy(a_r, b_w)), asyncio.ensure_future(copy(b_r, a_w))]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.exception() is not None for t in done if not t.cancelled()):
                    break
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _refuse(writer: asyncio.StreamWriter, socks: bool, socks_code: int, status: int, reason: str) -> None:
    if socks:
        writer.write(bytes([5, socks_code, 0, 1, 0, 0, 0, 0, 0, 0]))
    else:
        text = {403: "Forbidden", 502: "Bad Gateway", 400: "Bad Request"}.get(status, "Forbidden")
        body = f"coxswain's egress proxy refused this connection: {reason}\n".encode()
        writer.write(f"HTTP/1.1 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\nX-Cox-Egress: refused\r\n\r\n".encode()
                     + body)
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.drain(), 5)


async def _socks_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, int]:
    """A SOCKS5 greeting and CONNECT request (version byte already read): the target."""
    (n,) = await reader.readexactly(1)
    methods = await reader.readexactly(n)
    if 0 not in methods:
        writer.write(b"\x05\xff")
        await writer.drain()
        raise Refused("no acceptable SOCKS method")
    writer.write(b"\x05\x00")
    await writer.drain()
    ver, cmd, _, atyp = await reader.readexactly(4)
    if ver != 5:
        raise Refused("not SOCKS5")
    if atyp == 1:
        host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
    elif atyp == 4:
        host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
    elif atyp == 3:
        (ln,) = await reader.readexactly(1)
        host = (await reader.readexactly(ln)).decode("ascii", errors="replace")
    else:
        writer.write(b"\x05\x08\x00\x01\x00\x00\x00\x00\x00\x00")
        await writer.drain()
        raise Refused("address type")
    (port,) = struct.unpack("!H", await reader.readexactly(2))
    if cmd != 1:
        writer.write(b"\x05\x07\x00\x01\x00\x00\x00\x00\x00\x00")
        await writer.drain()
        raise Refused("only CONNECT")
    return host, port


HOP_HEADERS = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


async def _http_request(first: bytes, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> tuple[str, int, bytes]:
    """An HTTP proxy request's head: ``CONNECT host:port`` (head empty) or an absolute-form
    ``http://`` request (head: the request rewritten for the origin, ``Connection: close``)."""
    try:
        raw = first + await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        await _refuse(writer, False, 0, 400, f"the request head is longer than {HEAD_LIMIT} bytes")
        raise Refused("head too long") from None
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        await _refuse(writer, False, 0, 400, "not an HTTP/1 proxy request")
        raise Refused("not HTTP")
    method, target, version = parts
    if method == b"CONNECT":
        hostport = target.decode("ascii", errors="replace")
        host, sep, port_s = hostport.rpartition(":")
        if not sep or not port_s.isdigit():
            await _refuse(writer, False, 0, 400, "CONNECT needs host:port")
            raise Refused("bad CONNECT")
        return host, int(port_s), b""
    url = urlsplit(target.decode("ascii", errors="replace"))
    if url.scheme != "http" or not url.hostname:
        await _refuse(writer, False, 0, 400, "only CONNECT and absolute http:// requests are proxied")
        raise Refused("bad target")
    try:
        port = url.port or 80
    except ValueError:
        await _refuse(writer, False, 0, 400, "not a valid port")
        raise Refused("bad port") from None
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    kept = [ln for ln in lines[1:] if ln.split(b":", 1)[0].strip().lower() not in HOP_HEADERS]
    head = b"\r\n".join([b" ".join([method, path.encode(), version]), *kept, b"Connection: close"]) + b"\r\n\r\n"
    return url.hostname, port, head
