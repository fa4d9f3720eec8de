"""A real headless Chromium, driven over the DevTools protocol through a pipe.

Why a pipe (``--remote-debugging-pipe``) and not a port: no TCP port to pick or race for,
no websocket client to install; Chromium reads requests from its fd 3 and writes answers
to its fd 4, each a JSON message ended by a NUL byte. The process is started with
``posix_spawn`` (fds 3 and 4 placed exactly, nothing else inherited) in a process group of
its own, which :meth:`Browser.close` ends by its recorded pgid.

The flags: headless without a sandbox or GPU (a container, root in CI), and every
background connection off (component updates, sync, QUIC, first-run), so the closed
network refuses nothing it would otherwise try; a fresh profile per browser.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-pipe")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}")
                                       else None)
        if found:
            return found
    return None


def _high(*fds: int) -> tuple[int, ...]:
    """The fds moved to 10 or above (close-on-exec): dup2 into 3 and 4 in the child can then
    never overwrite one of them before it is placed."""
    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one page (a target attached in flat mode)."""

    def __init__(self, executable: str, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="outrig-chromium-"))
        self.log_path = self.profile / "chromium.log"
        to_child_r, self._to_child = _high(*os.pipe())
        self._from_child, from_child_w = _high(*os.pipe())
        actions = [
            (os.POSIX_SPAWN_DUP2, to_child_r, 3),
            (os.POSIX_SPAWN_DUP2, from_child_w, 4),
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(self.log_path), os.O_WRONLY | os.O_CREAT, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        argv = [executable, *FLAGS, f"--user-data-dir={self.profile / 'profile'}",
                "about:blank"]
        self.pid = os.posix_spawn(executable, argv, dict(os.environ), file_actions=actions,
                                  setpgroup=0)
        self.pgid = self.pid
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    # -- the protocol

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: bool = True) -> dict[str, Any]:
        """One request; its result (events meanwhile are kept in :attr:`events`)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session and self.session is not None:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        wanted = self._next_id
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == wanted:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result") or {}
                return result
            self.events.append(reply)

    def wait_event(self, method: str, *, after: int = 0) -> dict[str, Any]:
        """The first event ``method`` at or after index ``after`` of :attr:`events`."""
        deadline = time.monotonic() + self.timeout
        index = after
        while True:
            while index < len(self.events):
                if self.events[index].get("method") == method:
                    return self.events[index]
                index += 1
            self.events.append(self._read(deadline))

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no answer from Chromium in {self.timeout:.0f}s; its log: "
                                   f"{self.log_text()[-2000:]}")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium closed its pipe; its log: "
                                       f"{self.log_text()[-2000:]}")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    # -- a page

    def open_page(self, width: int = 1280, height: int = 900) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = self.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                       "flatten": True}, session=False)
        self.session = attached["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(domain)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1,
                                                         "mobile": False})

    def navigate(self, url: str) -> None:
        mark = len(self.events)
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", after=mark)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return (result.get("result") or {}).get("value")

    def console_errors(self) -> list[str]:
        """Errors the page reported: console.error, uncaught exceptions, failed loads."""
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params") or {}
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error",
                                                                               "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description")))
                                       for a in params.get("args") or []))
            elif method == "Runtime.exceptionThrown":
                errors.append(str(params.get("exceptionDetails") or {}))
            elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") \
                    == "error":
                errors.append(str(params["entry"].get("text")))
        return errors

    def requests(self) -> list[str]:
        return [str((e.get("params") or {}).get("request", {}).get("url"))
                for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path, *, full_page: bool = False,
                   height: int | None = None) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page or height:
            size = self.evaluate("[document.documentElement.scrollWidth, "
                                 "document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0],
                                "height": height or size[1], "scale": 1})
        data = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError, BrowserError):
            os.write(self._to_child, json.dumps({"id": 0, "method": "Browser.close"}).encode()
                     + b"\0")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        with contextlib.suppress(ProcessLookupError):  # helpers it left in its group
            os.killpg(self.pgid, signal.SIGKILL)
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)
