"""The fleet console: a web page the learner serves, showing every robot, every published version and
the learning curve, updated live; with a token, controls (pause/resume training, pin a robot to a
version, roll the fleet back).

aiohttp on a thread of its own with its own event loop, so a browser never takes time from the
serving thread that acks robots. Routes:

- ``GET /``: the page (``console_page.html``: plain HTML and JavaScript, nothing fetched from
  elsewhere, so it works on a learner without internet);
- ``GET /api/state``: the fleet's state (``robot_rl.learner.fleet.fleet_state``) as JSON;
- ``GET /api/events``: the same state every ``refresh_s`` as server-sent events;
- ``POST /api/training`` ``{"paused": bool}``, ``POST /api/pin`` ``{"robot": ID, "version": V|null}``,
  ``POST /api/fleet`` ``{"version": V|null}``: the controls, each needing the header
  ``Authorization: Bearer TOKEN`` (the token file ``robot-rl keys`` writes); without a token file the
  console is read-only and says so.

Off loopback the page would show the fleet, and with a token accept controls, from anywhere on the
network: it is served there only over https (``tls_cert``/``tls_key``), else refused at start with
the SSH tunnel to use instead.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import ipaddress
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.core.errors import ConfigError
from robot_rl.learner.config import ConsoleConfig
from robot_rl.learner.fleet import FleetSource, UpdateRate, fleet_state

if TYPE_CHECKING:
    from aiohttp import web


log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
Control = Callable[[dict[str, Any]], str]  # the request's JSON -> what was done (ValueError: a bad request)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve off this machine


def read_token(config: ConsoleConfig) -> str | None:
    """The controls' token (None: read-only); a named file that is missing or empty is a ConfigError."""
    if not config.token_file:
        return None
    path = Path(config.token_file)
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"learner.console.token_file={path}: {exc.strerror}; `robot-rl keys --out DIR` writes "
                          f"DIR/console.token") from exc
    if not token:
        raise ConfigError(f"learner.console.token_file={path} is empty; `robot-rl keys --out DIR` writes a token")
    return token


class FleetConsole:
    """``FleetConsole(service, config)`` checks the settings; ``start()`` serves (``url``); ``stop()``."""

    def __init__(self, service: FleetSource, config: ConsoleConfig) -> None:
        if not is_loopback(config.host) and not config.tls_cert:
            raise ConfigError(
                f"learner.console.host={config.host} would show the fleet (and take its controls) unencrypted "
                f"off this machine: give learner.console.tls_cert and tls_key, or keep host=127.0.0.1 and "
                f"open an SSH tunnel from your machine: ssh -L {config.port or 8765}:127.0.0.1:{config.port or 8765} "
                f"LEARNER_HOST")
        self.service = service
        self.config = config
        self.url: str | None = None
        self._token = read_token(config)
        self._update_rate = UpdateRate()
        self._state_lock = threading.Lock()
        self._state: tuple[float, str] = (0.0, "")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._closing = False

    @property
    def controls(self) -> bool:
        """Whether the console takes controls (a token is set)."""
        return self._token is not None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> str:
        """Serve on a thread of its own; returns (and logs) the page's address."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-console", daemon=True)
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(START_TIMEOUT_S)
        log.debug("fleet console: %s (%s)", self.url, "controls need the token" if self.controls else "read-only")
        return self.url

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._closing = True
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(START_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(START_TIMEOUT_S)
        loop.close()
        self._loop = None

    async def _serve(self) -> str:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024)  # controls are a few bytes of JSON
        app.router.add_get("/", self._page)
        app.router.add_get("/api/state", self._state_json)
        app.router.add_get("/api/events", self._events)
        app.router.add_post("/api/training", self._control_handler(self._set_training))
        app.router.add_post("/api/pin", self._control_handler(self._pin_robot))
        app.router.add_post("/api/fleet", self._control_handler(self._pin_fleet))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = self._tls()
        port = self.config.port
        try:
            await web.TCPSite(self._runner, self.config.host, port, ssl_context=context).start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise
            log.warning("fleet console: port %d is taken; serving on a free port instead", port)
            await web.TCPSite(self._runner, self.config.host, 0, ssl_context=context).start()
        bound = self._runner.addresses[0][1]
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"{'https' if context else 'http'}://{host}:{bound}"

    def _tls(self) -> ssl.SSLContext | None:
        if not self.config.tls_cert:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"learner.console.tls_cert / tls_key: {exc}") from exc
        return context

    # ------------------------------------------------------------ reading

    def state(self) -> str:
        """The fleet's state as JSON, computed at most once per ``refresh_s`` whatever the number of pages."""
        with self._state_lock:
            at, text = self._state
            if time.monotonic() - at >= self.config.refresh_s or not text:
                state = fleet_state(self.service, self._update_rate)
                state["learner"]["controls"] = self.controls
                text = json.dumps(state)
                self._state = (time.monotonic(), text)
            return text

    async def _page(self, request: web.Request) -> web.Response:
        from aiohttp import web

        page = files("robot_rl.learner").joinpath("console_page.html").read_text()
        return web.Response(text=page, content_type="text/html")

    async def _state_json(self, request: web.Request) -> web.Response:
        from aiohttp import web

        text = await asyncio.get_running_loop().run_in_executor(None, self.state)
        return web.Response(text=text, content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        try:
            while not self._closing:
                text = await loop.run_in_executor(None, self.state)
                await response.write(f"data: {text}\n\n".encode())
                await asyncio.sleep(self.config.refresh_s)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the page was closed, or the console stops
        return response

    # ------------------------------------------------------------ controls

    def _refusal(self, request: web.Request) -> tuple[int, str] | None:
        """(HTTP status, why) when ``request`` may not control the fleet; None when it may."""
        if self._token is None:
            return 403, ("this console is read-only: start the learner with learner.console.token_file=FILE "
                         "(robot-rl keys writes KEYS/console.token) to use its controls")
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not given:
            return 401, "controls need the console token (the learner's learner.console.token_file)"
        if not hmac.compare_digest(given.encode(), self._token.encode()):
            return 403, "wrong console token"
        return None

    def _control_handler(self, control: Control) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            from aiohttp import web

            refusal = self._refusal(request)
            if refusal is not None:
                log.warning("fleet console: refused %s from %s: %s", request.path, request.remote, refusal[1])
                return web.json_response({"error": refusal[1]}, status=refusal[0])
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
                done = await asyncio.get_running_loop().run_in_executor(None, control, body)
            except (ValueError, TypeError) as exc:  # json's errors are ValueErrors
                return web.json_response({"error": str(exc)}, status=400)
            log.info("fleet console: %s (from %s)", done, request.remote)
            with self._state_lock:
                self._state = (0.0, self._state[1])  # the next state shows the change
            return web.json_response({"ok": True, "done": done})

        return handle

    def _set_training(self, body: dict[str, Any]) -> str:
        paused = body.get("paused")
        if not isinstance(paused, bool):
            raise ValueError('say {"paused": true} or {"paused": false}')
        trainer = self.service.trainer
        trainer.set_paused(paused)
        return f"training {'paused' if paused else 'resumed'} at update {trainer.step}"

    def _pin_robot(self, body: dict[str, Any]) -> str:
        robot, version = body.get("robot"), _version(body)
        if not isinstance(robot, str) or not robot:
            raise ValueError('say which robot: {"robot": "ID", "version": V or null}')
        self.service.pin(version, robot)
        return f"robot {robot} pinned to v{version}" if version is not None else f"robot {robot} follows the fleet"

    def _pin_fleet(self, body: dict[str, Any]) -> str:
        version = _version(body)
        self.service.pin(version)
        return f"every robot rolled back to v{version}" if version is not None else "every robot follows the newest"


def console_line(console: FleetConsole) -> str:
    """What ``robot-rl run`` and ``robot-rl learner`` print: where the console is and whether it takes controls."""
    controls = ("controls with the token in learner.console.token_file" if console.controls else
                "read-only; controls need learner.console.token_file, which robot-rl keys writes")
    return f"fleet console: {console.url} ({controls})"


def _version(body: dict[str, Any]) -> int | None:
    version = body.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
        raise ValueError(f"version must be a published version number or null, got {version!r}")
    return version
