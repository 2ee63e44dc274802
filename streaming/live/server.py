"""The live preview server: one page, its static files, and one WebSocket (aiohttp).

    server = LiveServer(engine_factory, host="127.0.0.1", port=8765)
    server.serve_forever()                         # the CLI; Ctrl-C stops it
    # or, in tests / scripts:
    server.start_background(); server.url; server.stop()

Routes: GET / (the page), GET /static/NAME (only the files shipped in static/, by exact name),
GET /ws (the WebSocket, protocol.py). Every other path, and any name not in static/, is 404:
request paths are never joined to the file system. A WebSocket whose Origin names another host
is refused (403), so other web sites cannot drive a local server. At most MAX_CLIENTS at once.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from pathlib import Path
from typing import Callable

from aiohttp import WSMsgType, web

from .engine import LiveEngine
from .protocol import MAX_STRIKES, WS_MAX_BYTES, ProtocolError, RateLimiter, parse_message
from .transport import Client, Hub

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
MAX_CLIENTS = 32
SEND_BUFFER_BYTES = 128 * 1024
"""Kernel send buffer per viewer (fixed, not auto-tuned up to megabytes): a viewer that cannot keep
up stalls after a few frames and then skips frames, instead of watching seconds-old ones."""
STATUS_PERIOD = 0.25  # seconds between status messages to each client
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; connect-src 'self'; "
                               "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Name -> (bytes, content type) of every shipped page file, read once."""
    files = {}
    for p in sorted(STATIC_DIR.iterdir()):
        if p.is_file() and p.suffix in CONTENT_TYPES:
            files[p.name] = (p.read_bytes(), CONTENT_TYPES[p.suffix])
    return files


class LiveServer:
    """Owns the event loop, the hub of clients and the engine (made on startup by engine_factory(hub))."""

    def __init__(self, engine_factory: Callable[[Hub], LiveEngine], host: str = "127.0.0.1", port: int = 8765):
        self.engine_factory, self.host, self.port = engine_factory, host, port
        self.files = _static_files()
        self.engine: LiveEngine | None = None
        self.hub: Hub | None = None
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None

    # ---- HTTP -------------------------------------------------------------------------------

    def _file(self, name: str) -> web.Response:
        if name not in self.files:
            raise web.HTTPNotFound()
        body, ctype = self.files[name]
        return web.Response(body=body, content_type=ctype, headers=SECURITY_HEADERS)

    async def _index(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def _static(self, request: web.Request) -> web.Response:
        return self._file(request.match_info["name"])

    def _origin_ok(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:  # not a browser (scripts, tests)
            return True
        from urllib.parse import urlsplit

        return urlsplit(origin).netloc == request.host

    # ---- WebSocket --------------------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        if not self._origin_ok(request):
            raise web.HTTPForbidden(text="cross-origin WebSocket refused")
        if len(self.hub.clients) >= MAX_CLIENTS:
            raise web.HTTPServiceUnavailable(text=f"too many viewers (limit {MAX_CLIENTS})")
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_BYTES, heartbeat=20.0, compress=False)
        await ws.prepare(request)
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        client = self.hub.add(ws.send_bytes, ws.send_str)
        pump = asyncio.ensure_future(client.pump())
        engine, limiter, strikes = self.engine, RateLimiter(), 0
        presets = list(engine.presets)
        client.reply(json.dumps({"type": "hello", "presets": {n: p.prompt for n, p in engine.presets.items()},
                                 "sources": list(engine.sources), "status": engine.status()}))
        context = {"presets": presets, "sources": ("world", "file")}
        try:
            async for msg in ws:
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break
                try:
                    if not limiter.allow():
                        raise ProtocolError("rate limit: too many messages; slow down")
                    cmd = parse_message(msg.data, context)
                    if cmd.type == "ping":
                        client.reply(json.dumps({"type": "pong", "t": cmd.args["t"]}))
                    elif cmd.type == "passes":
                        (client.wants.add if cmd.args["on"] else client.wants.discard)("passes")
                    else:
                        problem = engine.command(cmd)
                        if problem:
                            raise ProtocolError(problem)
                    strikes = 0
                except ProtocolError as err:
                    strikes += 1
                    client.reply(json.dumps({"type": "error", "message": str(err)}))
                    if strikes >= MAX_STRIKES:  # stop the pump first: one writer per socket
                        self.hub.remove(client)
                        pump.cancel()
                        await asyncio.gather(pump, return_exceptions=True)
                        await ws.send_str(json.dumps({"type": "error", "message": f"{err} (closing after "
                                                                                  f"{strikes} refused messages)"}))
                        await ws.close(code=1008, message=b"too many refused messages")
                        break
        finally:
            self.hub.remove(client)
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        return ws

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(STATUS_PERIOD)
            status = self.engine.status()
            self.hub.broadcast_status(lambda c: json.dumps(
                {"type": "status", **status, "dropped": c.dropped, "sent": c.sent, "viewers": len(self.hub.clients)}))

    # ---- lifecycle --------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/ws", self._ws)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.hub = Hub(asyncio.get_running_loop())
        self.engine = self.engine_factory(self.hub)
        self.engine.start()
        self._status_task = asyncio.ensure_future(self._status_loop())

    async def _on_shutdown(self, app: web.Application) -> None:
        self._status_task.cancel()
        for client in list(self.hub.clients):
            self.hub.remove(client)
        await asyncio.get_running_loop().run_in_executor(None, self.engine.stop)

    async def _main(self) -> None:
        runner = web.AppRunner(self.make_app(), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            self.url = f"http://{self.host}:{port}/"
            self._stopped = asyncio.Event()
            self._started.set()
            await self._stopped.wait()
        finally:
            await runner.cleanup()

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        async def main():
            task = asyncio.ensure_future(self._main())
            while not self._started.is_set() and not task.done():
                await asyncio.sleep(0.05)
            if on_ready and self._started.is_set():
                on_ready(self.url)
            await task

        asyncio.run(main())

    def start_background(self, timeout: float = 60.0) -> str:
        """Serve from a daemon thread; returns the URL once listening."""

        def run():
            try:
                self._loop = asyncio.new_event_loop()
                self._loop.run_until_complete(self._main())
            except BaseException as err:  # reported by start_background
                self._error = err
                self._started.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="alaya-live-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout) or self._error:
            raise RuntimeError(f"live server did not start: {self._error}")
        return self.url

    def stop(self, timeout: float = 60.0) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout)
