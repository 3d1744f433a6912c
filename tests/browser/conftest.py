"""Browser fixtures: Debian's chromium driven by Playwright against the shop served over real
HTTP and registered as the Stripe sandbox's webhook endpoint.

Playwright's own browser download is not used: the tests launch /usr/bin/chromium (scripts/test
installs it with apt-get) and skip, saying why, where it is missing."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags chromium dials out (component updates, sync, QUIC
# probes) and a closed network refuses those connections loudly.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A page that needs longer than this to answer is a failure, not something to wait out.
ACTION_TIMEOUT_MS = 15_000


@pytest.fixture(scope="package")
def chromium():
    """One chromium for tests/browser (it takes about 3 s to start, once per module cost most of a
    minute a run), closed before the tests outside it run. Each test still has profiles of its
    own (new_page): no cookie or storage crosses tests. (The `browser` of tests/conftest.py is
    the shopper over HTTP, not this.)"""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); browser tests need it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    # expect() has its own 5 s default; a loaded CI machine needs the same bound as actions.
    sync_api.expect.set_options(timeout=ACTION_TIMEOUT_MS)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def new_page(chromium):
    """Opens a page in a fresh browser profile (no cookies: a new customer or operator) made with
    playwright's context options (`viewport`, `is_mobile`, `accept_downloads`, ...), its actions
    bound by ACTION_TIMEOUT_MS; every profile it opened is closed after the test."""
    contexts = []

    def open_page(**options):
        context = chromium.new_context(**options)
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture
def page(new_page):
    """A fresh browser profile at a desktop size for each test."""
    return new_page(viewport={"width": 1280, "height": 900})


@pytest.fixture(scope="session")
def screenshot_dir():
    """Where each test leaves its screenshot: BROWSER_SCREENSHOT_DIR when set (to look at
    them), otherwise a temporary folder removed at the end of the run."""
    wanted = os.environ.get("BROWSER_SCREENSHOT_DIR")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        yield Path(wanted)
        return
    folder = tempfile.mkdtemp(prefix="backstop-screens-")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
