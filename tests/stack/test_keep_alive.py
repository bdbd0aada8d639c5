"""An idle keep-alive connection outlives the clients' own idle expiry.

httpx (and so the ``cox`` CLI, the SDK and these tests) keeps an idle pooled connection for 5 s;
uvicorn's default closes one after 5 s too. Two equal timers race: a client that reuses its
connection as the server closes it gets ``Connection reset by peer`` on a request the server
never read (CI's archive drill hit this once). The server must be the side that waits longer.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

from tests.support.stack import TOKEN, Stack

HTTPX_KEEPALIVE_EXPIRY_S = 5.0


def request(sock: socket.socket, host: str) -> bytes:
    sock.sendall(f"GET /v1/sessions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the gateway closed the connection mid-response"
        body += chunk
    return head


def test_an_idle_connection_is_kept_longer_than_a_clients_pool_keeps_it(stack: Stack) -> None:
    url = urlsplit(stack.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        assert request(sock, url.netloc).startswith(b"HTTP/1.1 200")
        time.sleep(HTTPX_KEEPALIVE_EXPIRY_S + 1.0)
        head = request(sock, url.netloc)
        assert head.startswith(b"HTTP/1.1 200"), f"the gateway closed an idle connection a client may still reuse: {head!r}"
