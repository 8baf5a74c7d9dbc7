"""Look at the MLflow UI in a real browser: headless Chromium, driven over its DevTools protocol.

What a person does to compare a sweep's runs, done by a program: serve an MLflow store (``mlflow
server``, one worker, as ``make ui``), open the experiment's runs view filtered as a user types it
(``tags.scheduler = 'ebrl'``), expand the sweep's run to show its jobs, or open the comparison
page of some runs; read what the page lists and save a screenshot.

Needs Debian's ``chromium`` (``apt-get install -y chromium``) and aiohttp (installed with
``ray[default]``) for the DevTools websocket. Every process started here (the server, the
browser) is ended by its process group before returning.

Usage::

    python scripts/mlflow_ui.py --store outputs/mlflow --experiment smoke \\
        --filter "tags.scheduler = 'ebrl'" --screenshot results/mlflow-ui/runs.png
    python scripts/mlflow_ui.py --store outputs/mlflow --experiment smoke --compare ID1,ID2 \\
        --screenshot results/mlflow-ui/compare.png
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: headless Chromium as the project runs it: no sandbox (containers), no GPU, no network of its
#: own (updates, sync, QUIC), no crash reporter (its handler outlives the browser), a new profile
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-crash-reporter",
    "--disable-breakpad",
)


def chromium() -> str | None:
    """The Chromium executable, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """End a process started in a session of its own, with everything in its group."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def serve(store: str | Path, timeout: float = 120.0) -> Iterator[str]:
    """An MLflow server over a local store (``<store>/mlflow.db``, ``<store>/mlartifacts``) on a
    free loopback port; yields its base URL and stops it (and its worker) on exit."""
    store = Path(store).resolve()
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{store / 'mlflow.db'}",
        "--artifacts-destination",
        str(store / "mlartifacts"),
    ]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not _healthy(url):
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"mlflow server exited: {log.read()[-2000:].decode()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server not up after {timeout:.0f} s")
                time.sleep(0.5)
            yield url
        finally:
            _stop(proc)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def experiment_id(url: str, name: str) -> str:
    q = urllib.parse.urlencode({"experiment_name": name})
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?{q}") as r:
        return str(json.loads(r.read())["experiment"]["experiment_id"])


def runs_url(url: str, exp_id: str, search: str | None = None) -> str:
    """The experiment's runs view, with a search as typed into its search box."""
    q = f"?{urllib.parse.urlencode({'searchFilter': search})}" if search else ""
    return f"{url}/#/experiments/{exp_id}/runs{q}"


def compare_url(url: str, exp_id: str, run_ids: list[str]) -> str:
    """The comparison page of ``run_ids``."""
    q = urllib.parse.urlencode({"runs": json.dumps(run_ids), "experiments": json.dumps([exp_id])})
    return f"{url}/#/compare-runs?{q}"


class _Page:
    """One browser tab over the DevTools protocol (JSON messages on a websocket)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        i = self.n
        await self.ws.send_json({"id": i, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def js(self, expression: str) -> Any:
        r = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r["result"].get("value")

    async def text(self) -> str:
        return str(await self.js("document.body ? document.body.innerText : ''") or "")

    async def wait_text(self, pattern: str, timeout: float) -> str:
        """The page's text once ``pattern`` (a regex) matches it; raises on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            text = await self.text()
            if re.search(pattern, text):
                return text
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pattern!r} not on the page after {timeout:.0f} s")
            await asyncio.sleep(0.5)


@dataclass
class Seen:
    """What the page showed: its text, and the screenshot written."""

    text: str
    screenshot: Path


#: expand every parent row of the runs table (a sweep's run shows its jobs): the run-name cell's
#: expander button (MLflow 3's RunNameCellRenderer); returns how many were clicked
_EXPAND = """(() => {
  const b = document.querySelectorAll(
    '[role="row"] button[data-component-id*="runnamecellrenderer"]');
  b.forEach(x => x.click());
  return b.length;
})()"""
#: room for the table: close the assistant side panel, widen the run-name column to its names
_TIDY = """(() => {
  document.querySelectorAll('button[aria-label="Close"]').forEach(x => x.click());
  const h = document.querySelector('.ag-header-cell[col-id*="Run Name"] .ag-header-cell-resize');
  if (h) h.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
  return true;
})()"""


async def _look(
    url: str,
    screenshot: Path,
    ready: str,
    expect: list[str],
    expand: bool,
    size: tuple[int, int],
    timeout: float,
) -> Seen:
    import aiohttp

    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
    profile = tempfile.mkdtemp(prefix="ebrl-chromium-")
    cmd = [
        exe,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        f"--window-size={size[0]},{size[1]}",
        "about:blank",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                tabs = await r.json()
            ws_url = next(t["webSocketDebuggerUrl"] for t in tabs if t["type"] == "page")
            async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                page = _Page(ws)
                await page.call("Page.enable")
                await page.call("Page.navigate", url=url)
                await page.wait_text(ready, timeout)
                await asyncio.sleep(1.0)  # the table's rows render after the count
                if expand and not await page.js(_EXPAND):
                    raise RuntimeError("no parent row to expand on the page")
                await page.js(_TIDY)
                for name in expect:
                    await page.wait_text(re.escape(name), timeout)
                await asyncio.sleep(1.0)  # let the last rows and charts paint
                text = await page.text()
                shot = await page.call("Page.captureScreenshot", format="png")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        return Seen(text, screenshot)
    finally:
        _stop(proc)
        shutil.rmtree(profile, ignore_errors=True)


def look(
    url: str,
    screenshot: str | Path,
    *,
    ready: str = r"[1-9]\d* matching runs?",
    expect: list[str] | tuple[str, ...] = (),
    expand: bool = True,
    size: tuple[int, int] = (1600, 1000),
    timeout: float = 90.0,
) -> Seen:
    """Open ``url`` in headless Chromium, wait until the page's text matches ``ready`` (the runs
    view's count of runs, by default) and shows every string of ``expect`` (after expanding
    parent rows when ``expand``), save a screenshot; returns what the page said."""
    return asyncio.run(_look(url, Path(screenshot), ready, list(expect), expand, size, timeout))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="the local MLflow store (outputs/mlflow)")
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--filter", help="the runs view's search, e.g. \"tags.scheduler = 'ebrl'\"")
    ap.add_argument("--compare", help="comma-separated run ids: their comparison page instead")
    ap.add_argument("--expect", default="", help="comma-separated texts the page must show")
    ap.add_argument("--screenshot", required=True)
    ap.add_argument("--size", default="1600,1000", help="window width,height in pixels")
    args = ap.parse_args(argv)
    w, h = (int(x) for x in args.size.split(","))
    expect = [x for x in args.expect.split(",") if x]
    with serve(args.store) as url:
        exp = experiment_id(url, args.experiment)
        if args.compare:
            target = compare_url(url, exp, args.compare.split(","))
            seen = look(
                target,
                args.screenshot,
                ready="Run ID|Run Name",
                expect=expect,
                expand=False,
                size=(w, h),
            )
        else:
            target = runs_url(url, exp, args.filter)
            seen = look(target, args.screenshot, expect=expect, size=(w, h))
    print(seen.text)
    print(f"screenshot: {seen.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
