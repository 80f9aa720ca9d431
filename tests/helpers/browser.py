"""Headless Chromium driven over the DevTools protocol (CDP), for tests that look at the Prefect UI.

Why raw CDP: the only client it needs is ``websockets``, which Prefect already depends on, so the
test adds no Python package and no chromedriver; the five CDP calls used here (navigate, evaluate,
screenshot, set the viewport, close) are stable across Chromium versions.

Chromium is started as the machine notes say (root, no sandbox, no GPU, no background networking)
with a fresh ``--user-data-dir`` and ``--remote-debugging-port=0``; the port it picked is read from
``DevToolsActivePort``. It listens on 127.0.0.1 only. :meth:`Browser.close` stops the process
group it started, by pid.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def find_chromium() -> str | None:
    for name in (os.environ.get("E3P_CHROMIUM"), *CHROMIUM_NAMES):
        found = name and shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page. Use as a context manager."""

    def __init__(
        self,
        executable: str,
        *,
        width: int = 1400,
        height: int = 1000,
        start_timeout_s: float = 60,
        extra_flags: tuple[str, ...] = (),
    ):
        from websockets.sync.client import connect

        self.profile = Path(tempfile.mkdtemp(prefix="e3p-chromium-"))
        self.log = self.profile / "chromium.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    executable,
                    *FLAGS,
                    *extra_flags,
                    f"--user-data-dir={self.profile}",
                    f"--window-size={width},{height}",
                    "about:blank",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._ids = itertools.count(1)
        try:
            port = self._devtools_port(start_timeout_s)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
                pages = [t for t in json.load(resp) if t.get("type") == "page"]
            if not pages:
                raise BrowserError("Chromium started without a page")
            self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=20)
            self.call("Page.enable")
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, timeout_s: float) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrowserError(
                    f"Chromium exited with code {self.proc.returncode}: {self.log.read_text(errors='replace')[-1500:]}"
                )
            text = active.read_text() if active.exists() else ""
            if text.strip():
                return int(text.split()[0])
            time.sleep(0.1)
        raise BrowserError(f"Chromium did not open its DevTools port in {timeout_s} s")

    def call(self, method: str, params: dict | None = None, timeout_s: float = 60) -> dict:
        """Send one CDP command and return its result (events in between are skipped)."""
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout_s
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def goto(self, url: str) -> None:
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def text(self) -> str:
        """What the page shows as text now."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *needles: str, timeout_s: float = 60) -> str:
        """Poll the page's text until every needle is in it; return the text (else raise with it)."""
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(0.5)
        missing = [n for n in needles if n not in text]
        raise BrowserError(
            f"after {timeout_s} s the page at {self.evaluate('location.href')} lacks {missing}; "
            f"it shows: {' '.join(text.split())[:1500]}"
        )

    def click_text(self, label: str) -> bool:
        """Click what shows exactly ``label`` (the link, button or tab around it, else the element
        itself); False if nothing on the page shows it."""
        return bool(
            self.evaluate(
                "(() => { const want = %s;"  # noqa: UP031 - a JavaScript template full of braces
                " const hits = [...document.querySelectorAll('body *')].filter("
                "   el => el.innerText && el.innerText.trim() === want"
                "         && ![...el.children].some(c => c.innerText && c.innerText.trim() === want));"
                " if (!hits.length) return false;"
                " const el = hits[0];"
                " (el.closest('a, button, [role=tab], [role=tablist] > *') || el).click();"
                " return true; })()" % json.dumps(label)
            )
        )

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                ws.close()
            except Exception:
                pass
        # Chromium's own processes (zygote, renderers) share the session and group we started it in.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
