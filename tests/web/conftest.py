"""Fixtures of the browser tests: a uvicorn server on a free loopback port, Debian's Chromium
driven by Playwright (never a downloaded browser), and a folder for screenshots."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("TRAINLEDGER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def artifacts_dir() -> Path:
    d = Path(os.environ.get("TRAINLEDGER_ARTIFACTS") or Path(__file__).parent / "artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def artifacts() -> Path:
    return artifacts_dir()


@pytest.fixture(scope="session")
def server_url():
    uvicorn = pytest.importorskip("uvicorn")
    from trainledger.web import create_app, loopback_hosts

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(allowed_hosts=loopback_hosts("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the web app did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory):
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).exists()):
        pytest.skip(f"Chromium not installed at {CHROMIUM} (CI installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1366, "height": 900}, accept_downloads=True)
        ctx.set_default_timeout(20_000)
        yield ctx
        ctx.close()


@pytest.fixture()
def page(browser_context, server_url):
    pg = browser_context.new_page()
    pg.problems = []  # console errors and CSP violations seen by this page
    pg.on("console", lambda m: pg.problems.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.problems.append(str(e)))
    yield pg
    pg.close()
