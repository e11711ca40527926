"""Headless Chromium driven over the DevTools protocol (tornado's websocket client): screenshots after JS has run."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def devtools_caller(conn):
    """`await call(method, **params)` -> the result of one DevTools protocol command over websocket `conn`."""
    ids = itertools.count(1)

    async def call(method, **params):
        i = next(ids)
        await conn.write_message(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(await conn.read_message())
            if msg.get("id") == i:
                return msg.get("result", {})

    return call


async def _screenshot(ws_url: str, url: str, settle_s: float, size: tuple[int, int], before: str | None = None) -> bytes:
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(ws_url, max_message_size=64 * 2**20)
    call = devtools_caller(conn)

    await call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1, mobile=False)
    await call("Page.enable")
    await call("Page.navigate", url=url)
    await asyncio.sleep(settle_s)  # BokehJS renders after the page (and, for a server app, its websocket) loads
    if before is not None:  # e.g. click a tab, then let BokehJS draw it
        await call("Runtime.evaluate", expression=before)
        await asyncio.sleep(min(settle_s, 3.0))
    data = (await call("Page.captureScreenshot", format="png"))["data"]
    conn.close()
    return base64.b64decode(data)


def screenshot(url: str, png: Path, profile: Path, settle_s: float = 4.0, size=(1100, 900),
               before: str | None = None) -> Path:
    """Open url in headless Chromium, wait settle_s seconds (then run the JavaScript `before`, if given, and wait
    again), write a PNG screenshot."""
    profile.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([CHROMIUM, *FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            target = next(t for t in json.load(response) if t["type"] == "page")
        png.write_bytes(asyncio.run(_screenshot(target["webSocketDebuggerUrl"], url, settle_s, size, before)))
        return png
    finally:
        proc.terminate()
        proc.wait(timeout=20)
