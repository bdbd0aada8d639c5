"""What the console tests share: Debian's chromium through Playwright, the skip marks when either
is missing, one browser context per module, the login, and axe-core.

Each console module has its own ``cox up`` (its own config) and its own ``browser`` fixture built
with :func:`chromium`; the page, the login and the accessibility check come from here so they are
written once.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import pytest

from .coxup import CoxUp

CHROMIUM = os.environ.get("COX_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

try:
    # sync_playwright is re-exported: tests/stack/test_mcp.py skips by it as the console tests do.
    from playwright.sync_api import BrowserContext, ConsoleMessage, Page, Request, Response, expect
    from playwright.sync_api import sync_playwright as sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.skipif(sync_playwright is None, reason="the playwright package is not installed (pip install -e '.[dev]')"),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium; ./dev does it as root)"),
]
"""The console modules' skip marks (``pytestmark = browser.pytestmark`` or imported)."""


@contextmanager
def chromium(width: int = 1360, height: int = 860, init_script: str | None = None) -> Iterator[BrowserContext]:
    """A headless chromium with a fresh profile, pages ``width`` x ``height``; ``init_script``
    runs in every page before its own scripts."""
    expect.set_options(timeout=30_000)
    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="cox-chromium-") as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        if init_script:
            ctx.add_init_script(init_script)
        try:
            yield ctx
        finally:
            ctx.close()


class Watch:
    """What a page logged, threw and fetched from its first request on: the console's warnings
    and errors, uncaught errors, failed requests and answers >= 400, and the requests still open."""

    def __init__(self, page: Page) -> None:
        self.said: list[str] = []
        self.open: dict[int, str] = {}
        page.on("console", self.logged)
        page.on("pageerror", lambda e: self.said.append(f"uncaught: {e}"))
        page.on("requestfailed", self.failed)
        page.on("response", self.answered)
        page.on("request", self.opened)
        page.on("requestfinished", self.finished)

    def logged(self, m: ConsoleMessage) -> None:
        if m.type in ("error", "warning"):
            self.said.append(f"{m.type}: {m.text}")

    def answered(self, r: Response) -> None:
        if r.status >= 400:
            self.said.append(f"{r.status} {r.request.method} {r.url}")

    def opened(self, r: Request) -> None:
        self.open[id(r)] = f"{r.method} {r.url}"

    def finished(self, r: Request) -> None:
        self.open.pop(id(r), None)

    def failed(self, r: Request) -> None:
        self.open.pop(id(r), None)
        self.said.append(f"request failed: {r.method} {r.url} {r.failure}")

    def report(self) -> str:
        return f"the page said: {self.said[-20:]}; requests not finished: {list(self.open.values())[-20:]}"


_watches: dict[Page, Watch] = {}


def _forget(page: Page) -> None:
    _watches.pop(page, None)


def watch(page: Page) -> Watch:
    """The page's :class:`Watch`, started now if :func:`open_page` did not start it at its creation."""
    if page not in _watches:
        _watches[page] = Watch(page)
        page.on("close", lambda _: _forget(page))
    return _watches[page]


def open_page(ctx: BrowserContext, url: str, width: int | None = None) -> tuple[Page, list[str]]:
    """A new page at ``url`` (``width`` px wide if given), and the list its uncaught errors go to
    (a test asserts it empty at the end). The page is watched (:class:`Watch`) from before its
    first request, so a login that fails can say what happened while it loaded."""
    pg = ctx.new_page()
    if width:
        pg.set_viewport_size({"width": width, "height": 860})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    watch(pg)
    pg.goto(url)
    return pg, errors


def login(page: Page, up: CoxUp) -> None:
    """Log in with ``up``'s token (a wrong one first: the form says so), unless already in.

    The page decides what it shows once its module has run (a token saved by an earlier page of
    the same profile opens the console, none shows the form), so this waits for either before it
    looks: a look taken before the module ran saw neither and waited for the console that the
    form was about to ask for.

    When the console does not open, the failure says what the page showed and everything it
    logged, threw and fetched with an error since it was opened (:class:`Watch`), and whether its
    modules ran (``window.cox``): in CI (stops 38, 41, 51, 53) ``#app`` stayed hidden for 30 s
    with no uncaught error; at stop 53 neither the form nor the console showed on a complete
    document, which is the modules not having run at all (index.html now reloads once when they
    did not, and says which files did not come)."""
    seen = watch(page)
    try:
        expect(page.locator("#login:not([hidden]), #app:not([hidden])").first).to_be_visible()
        if page.locator("#login").is_visible():
            page.fill("#login-token", "wrong-token")
            page.click("#login-form button")
            expect(page.locator("#login-error")).to_contain_text("not known")
            page.fill("#login-token", up.token)
            page.click("#login-form button")
        expect(page.locator("#app")).to_be_visible()
    except AssertionError as exc:
        shown = page.evaluate("""() => ({login: !document.querySelector('#login').hidden,
            app: !document.querySelector('#app').hidden, ready: document.readyState,
            modules_ran: !!window.cox, boot_error: !document.querySelector('#boot-error').hidden,
            error: document.querySelector('#login-error').textContent,
            token_field: document.querySelector('#login-token').value.length,
            stored: localStorage.length})""")
        raise AssertionError(f"the console did not open after the login: {shown}; {seen.report()}") from exc


def new_session(page: Page, workspace: str, create: bool = True) -> str:
    """Create a session from the sidebar's form; its id once its stream is live."""
    page.fill("#new-workspace", workspace)
    if create:
        page.check("#new-create")
    page.click("#new-session button[type=submit]")
    expect(page.locator("#session")).to_be_visible()
    expect(page.locator("#stream")).to_have_text("live")
    m = re.search(r"#/s/([A-Za-z0-9_-]+)$", page.url)
    assert m, page.url
    return m.group(1)


def axe(page: Page) -> list[dict[str, Any]]:
    """Serious and critical axe-core violations (axe.min.js as the axe-playwright-python wheel ships it)."""
    pytest.importorskip("axe_playwright_python")
    page.add_script_tag(content=resources.files("axe_playwright_python").joinpath("axe.min.js").read_text())
    res = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations")
    return [v for v in res if v.get("impact") in ("serious", "critical")]


def no_serious_axe(page: Page) -> None:
    bad = axe(page)
    assert bad == [], [(v["id"], v["help"], [n["target"] for n in v["nodes"]][:5]) for v in bad]
