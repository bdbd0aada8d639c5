"""An idle keep-alive connection outlives the clients' own idle expiry.

httpx (and so the ``cox`` CLI, the SDK and these tests) keeps an idle pooled connection for 5 s;
uvicorn's default closes one after 5 s too. Two equal timers race: a client that reuses its
connection as the server closes it gets ``Connection reset by peer`` on a request the server
never read (CI's archive drill hit this once). The server must be the side that waits longer.
"""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

import httpx

from tests.support.stack import TOKEN, Stack

HTTPX_KEEPALIVE_EXPIRY_S = httpx.Limits().keepalive_expiry or 5.0
"""How long httpx's pool keeps an idle connection (its default: 5 s)."""


def test_an_idle_connection_is_kept_longer_than_a_clients_pool_keeps_it(stack: Stack) -> None:
    url = urlsplit(stack.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        for i in range(2):
            if i:
                time.sleep(HTTPX_KEEPALIVE_EXPIRY_S + 1.0)
            # http.client reuses its open socket: a gateway that closed it answers nothing
            # (RemoteDisconnected or a reset), as a pooled client's request is lost.
            conn.request("GET", "/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
            r = conn.getresponse()
            r.read()
            assert r.status == 200, r.status
            assert not r.will_close, "the gateway asked to close the connection"
    finally:
        conn.close()
