"""Shared fixtures: small predictions, and a headless Chromium driven over DevTools (CDP).

Why CDP and not playwright/selenium: Debian's chromium speaks it natively, so the tests need
one small websocket client and no downloaded browser or driver binary; CDP also reports every
network request and JavaScript dialog, which is exactly what the offline and escaping checks
need to observe.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nnperf.prediction import Prediction, predict

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
#: How long Chromium may take to open its DevTools port: a cold start, its binary read back
#: from disk after a suite has filled the page cache, took 35 s on the 2-core CI VM (then
#: 0.2-2.6 s warm); the wait ends as soon as the port is open.
CHROMIUM_START_S = 120
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1000",
]


def tiny_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))


@pytest.fixture(scope="session")
def mlp_prediction() -> Prediction:
    """A 3-layer MLP training step on an H100 (bf16): fast to trace, every op kind present."""
    return predict(tiny_mlp(), "h100", inputs=torch.randn(64, 256), dtype="bf16")


class Page:
    """One Chromium tab: navigate, evaluate, hover, screenshot; records requests and dialogs."""

    def __init__(self, ws_url: str):
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self._ids = itertools.count(1)
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.exceptions: list[str] = []
        self.loaded = False
        for method in ("Page.enable", "Network.enable", "Runtime.enable"):
            self.call(method)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Page.javascriptDialogOpening":
            self.dialogs.append(params.get("message", ""))
            self.ws.send(json.dumps({"id": next(self._ids), "method": "Page.handleJavaScriptDialog",
                                     "params": {"accept": True}}))
        elif method == "Runtime.exceptionThrown":
            self.exceptions.append(json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Page.loadEventFired":
            self.loaded = True

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        mid = next(self._ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def pump(self, seconds: float) -> None:
        """Process events for a while (dialogs, late requests)."""
        import websocket

        end = time.monotonic() + seconds
        self.ws.settimeout(0.05)
        try:
            while time.monotonic() < end:
                with contextlib.suppress(websocket.WebSocketTimeoutException):  # nothing pending
                    self._event(json.loads(self.ws.recv()))
        finally:
            self.ws.settimeout(30)

    def open(self, path: Path, timeout: float = 20) -> float:
        """Load a file and wait for the load event and the report script; seconds it took."""
        self.loaded = False
        start = time.perf_counter()
        self.call("Page.navigate", url=path.resolve().as_uri())
        end = time.monotonic() + timeout
        while not self.loaded and time.monotonic() < end:
            self.pump(0.02)
        while time.monotonic() < end and not self.eval(
                "!!document.querySelector('.nnperf[data-ready]') || document.readyState === 'complete'"):
            self.pump(0.02)
        return time.perf_counter() - start

    def eval(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        pytest.skip("websocket-client is not installed (pip install -e '.[test]')")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A headless Chromium with a fresh profile; yields its DevTools HTTP endpoint."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen(
        [chromium_path, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + CHROMIUM_START_S
    while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"chromium exited with {proc.returncode} before DevTools came up")
        time.sleep(0.05)
    if not port_file.exists():
        proc.kill()
        pytest.fail(f"chromium did not open a DevTools port within {CHROMIUM_START_S} s")
    port = int(port_file.read_text().split()[0])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def page(browser: str) -> Iterator[Page]:
    """A fresh tab (so requests and dialogs recorded belong to one test)."""
    req = urllib.request.Request(f"{browser}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as resp:
        target = json.loads(resp.read())
    p = Page(target["webSocketDebuggerUrl"])
    try:
        yield p
    finally:
        p.ws.close()
        urllib.request.urlopen(f"{browser}/json/close/{target['id']}", timeout=10).close()
