"""A minimal W3C WebDriver client for Debian's chromium + chromium-driver: the
protocol is plain JSON over HTTP, so the browser test needs no Selenium."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from bench.common import free_ports

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> tuple[str, str] | None:
    """(chromedriver, chromium) paths, or None when either is missing."""
    driver = shutil.which("chromedriver")
    browser = next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)
    return (driver, browser) if driver and browser else None


class Browser:
    def __init__(self, driver_path: str, browser_path: str, width: int = 1400, height: int = 1000) -> None:
        (port,) = free_ports(1)
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([driver_path, f"--port={port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("chromedriver did not come up within 20 s")
            time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": browser_path,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}"]}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"webdriver {method} {path}: {exc.read()[:500]!r}") from None

    def _session(self, method: str, path: str, body: Any = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        self._session("POST", "/url", {"url": url})

    def run_js(self, script: str, *args: Any) -> Any:
        """Run `script` (a function body) in the page; its return value comes back as JSON."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def click(self, css: str, attempts: int = 5) -> None:
        """A real click (pointer events) on the first element matching css. A page that
        re-renders (the dashboard does every 2 s) can replace the element between finding
        and clicking it: find it again."""
        for attempt in range(attempts):
            element = self._session("POST", "/element", {"using": "css selector", "value": css})
            try:
                self._session("POST", f"/element/{element[ELEMENT]}/click", {})
                return
            except RuntimeError as exc:
                if "stale element reference" not in str(exc) or attempt == attempts - 1:
                    raise

    def screenshot(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(base64.b64decode(self._session("GET", "/screenshot")))

    def close(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}")
        finally:
            self.proc.terminate()
            self.proc.wait(10)
