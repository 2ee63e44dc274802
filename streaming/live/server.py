"""The live preview server: one page, its static files, and one WebSocket (aiohttp).

    server = LiveServer(page_factory, host="127.0.0.1", port=8765)
    server.serve_forever()                         # the CLI; Ctrl-C stops it
    # or, in tests / scripts:
    server.start_background(); server.url; server.stop()

Routes: GET / (the page), GET /static/NAME (only the files shipped in static/, by exact name),
GET /ws (the page's WebSocket, protocol.py), GET /engine (an engine's session: it sends G-buffer
frames and gets its rendered frames back, wire.py and ingest.py; at most max_sessions sessions,
the page's stream included, all on the same loaded weights; a session whose connection drops is
kept resume_grace seconds for its client to resume it: GET /engine?resume=TOKEN&have=N). Every
other path, and any name not in static/, is 404: request paths are never joined to the file
system. A WebSocket whose Origin names another host
is refused (403), so other web sites cannot drive a local server. Every request whose Host header
is not a loopback name (localhost, 127.0.0.1, [::1]), an IP address, the configured --host or (when
bound to all addresses) this machine's name is refused (403): a DNS-rebinding page (evil.example
re-pointed at 127.0.0.1) reaches the socket but not the server. At most MAX_CLIENTS at once.
A message the server cannot handle gets an error reply; the socket and the renderer go on.
A viewer may ask for its video over WebRTC (webrtc.py, when aiortc is installed): signalling goes
over /ws ({"type": "webrtc", "on": true} -> an offer; {"type": "answer", "sdp"}), and once the peer
connects its JPEG frames stop; when it fails or closes they resume.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from aiohttp import WebSocketError, WSMsgType, web

from . import webrtc, wire
from .page_session import PageSession
from .ingest import EngineSession
from .protocol import ENGINE_TYPES, MAX_STRIKES, WS_MAX_BYTES, ProtocolError, RateLimiter, parse_message
from .transport import Client, Hub, Outbox

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
MAX_CLIENTS = 32
MAX_SESSIONS = 4
"""Render sessions at once by default, the page's stream included: each holds its own stream state
(and up to its in-flight cap of frames), all share one set of weights and take turns on it."""
SEND_BUFFER_BYTES = 128 * 1024
"""Kernel send buffer per viewer (fixed, not auto-tuned up to megabytes): a viewer that cannot keep
up stalls after a few frames and then skips frames, instead of watching seconds-old ones."""
MAX_PEERS = 8
"""WebRTC viewers at once: each has its own video encoder (CPU); more viewers stay on JPEG."""
STATUS_PERIOD = 0.25  # seconds between status messages to each client
RESUME_GRACE = 30.0
"""Seconds an engine session whose connection dropped is kept for its client to resume it (serve
--resume-grace): its stream state, prompt and unanswered frames wait, and it counts as a session."""
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; connect-src 'self'; "
                               "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
TOKEN_COOKIE = "alaya_flash_token"
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def host_name(header: str) -> str:
    """The name part of a Host header, lower case, without port or IPv6 brackets ("" when malformed)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        rest = header[end + 1:] if end > 0 else "x"
        return header[1:end] if end > 0 and (rest == "" or rest[:1] == ":" and rest[1:].isdigit()) else ""
    name, colon, port = header.partition(":")
    return name if not colon or port.isdigit() else ""


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Name -> (bytes, content type) of every shipped page file, read once."""
    files = {}
    for p in sorted(STATIC_DIR.iterdir()):
        if p.is_file() and p.suffix in CONTENT_TYPES:
            files[p.name] = (p.read_bytes(), CONTENT_TYPES[p.suffix])
    return files


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on every address `host` names, all on one port (0: the first's free one), as
    aiohttp's TCPSite binds them; a port already in use is an OSError at once, naming host and port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if socks[0] is not sock:  # port 0: every address on the first one's port
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as err:
                raise OSError(err.errno, f"{host}:{port}: {(err.strerror or str(err)).lower()}") from None
            sock.listen(128)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


@dataclass(eq=False)
class EngineLink:
    """An engine session, its outbox and the socket it is on (None while it waits to be resumed)."""

    session: EngineSession
    outbox: Outbox
    token: str | None  # the resume token its hello gives (None: --resume-grace 0)
    ws: web.WebSocketResponse | None = None
    pump: asyncio.Future | None = None  # the outbox's writer on ws
    received: int = 0  # frame messages read with a readable number (admitted or refused), every socket
    hello: dict | None = None  # as sent (a resume sends it again)
    ended: str | None = None  # why the session cannot go on, once it cannot
    expiry: asyncio.TimerHandle | None = None  # while kept after a drop


class LiveServer:
    """Owns the event loop, the hub of clients and the page session (made on startup by page_factory(hub))."""

    def __init__(self, page_factory: Callable[[Hub], PageSession], host: str = "127.0.0.1", port: int = 8765,
                 make_renderer: Callable | None = None, max_sessions: int = MAX_SESSIONS, use_webrtc: bool = True,
                 token: str | None = None, resume_grace: float = RESUME_GRACE):
        """make_renderer: what engine sessions render with (the page session's own factory, so the weights are
        shared); None refuses /engine. max_sessions counts the page's stream as one. use_webrtc=False:
        JPEG over WebSocket only (WebRTC also needs aiortc). token: every request (the page, the
        WebSocket, /engine) must carry it, as ?token= or the cookie the page gets with it. resume_grace:
        seconds an engine session whose connection dropped waits for its client to resume it (0: it ends)."""
        self.page_factory, self.host, self.port, self.token = page_factory, host, port, token
        self.make_renderer, self.max_sessions, self.resume_grace = make_renderer, max_sessions, resume_grace
        self.sessions: dict[int, EngineLink] = {}  # engine sessions by id, those kept for a resume included
        self._resumable: dict[str, EngineLink] = {}  # by resume token, until the session ends or its grace does
        self._stopping = False
        self._session_ids = 0
        self.files = _static_files()
        self.page: PageSession | None = None
        self.hub: Hub | None = None
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.hosts = self._allowed_hosts(host)
        self.webrtc_reason = webrtc.unavailable() if use_webrtc else "turned off (serve --no-webrtc)"
        self._rtc_tasks: set[asyncio.Task] = set()  # offers and answers under way (referenced until done)

    @staticmethod
    def _allowed_hosts(host: str) -> frozenset[str]:
        """Host header names served: loopback names, the configured host and, bound to all addresses,
        this machine's names (IP addresses are always served: they cannot be re-pointed by DNS)."""
        names = set(LOOPBACK_NAMES) | {host_name(host) or host.strip("[]").lower()}
        if host in WILDCARD_HOSTS:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return frozenset(n for n in names if n)

    def host_ok(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without Host: not a browser
            return True
        name = host_name(header)
        return bool(name) and (name in self.hosts or _is_ip(name))

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

    @web.middleware
    async def _check_host(self, request: web.Request, handler):
        if not self.host_ok(request.headers.get("Host")):
            return web.Response(status=403, text="forbidden: the Host header does not name this server\n",
                                headers=SECURITY_HEADERS)
        return await handler(request)

    @web.middleware
    async def _check_token(self, request: web.Request, handler):
        if self.token is None:
            return await handler(request)
        given = request.query.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return web.Response(status=401, text="unauthorized: this server needs its token (open the address "
                                "`alaya-flash serve` printed, with ?token=...)\n", headers=SECURITY_HEADERS)
        response = await handler(request)
        if "token" in request.query and isinstance(response, web.Response):  # the page's own requests carry it on
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="Strict", path="/")
        return response

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
        page, limiter, strikes = self.page, RateLimiter(), 0
        presets = list(page.presets)
        rtc = {"webrtc": self.webrtc_reason is None, **({"webrtc_reason": self.webrtc_reason} if self.webrtc_reason else {})}
        client.reply(json.dumps({"type": "hello", "presets": {n: p.prompt for n, p in page.presets.items()},
                                 "sources": list(page.sources), **rtc, "status": page.status()}))
        context = {"presets": presets, "sources": ("world", "file")}
        try:
            async for msg in ws:
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break  # an error on the socket (a message over WS_MAX_BYTES, a broken frame): closed
                problem = self._handle(msg.data, client, limiter, context)
                if problem is None:
                    strikes = 0
                    continue
                strikes += 1
                client.reply(json.dumps({"type": "error", "message": problem}))
                if strikes >= MAX_STRIKES:  # stop the pump first: one writer per socket
                    self.hub.remove(client)
                    pump.cancel()
                    await asyncio.gather(pump, return_exceptions=True)
                    try:
                        await ws.send_str(json.dumps({"type": "error", "message": f"{problem} (closing after "
                                                                                  f"{strikes} refused messages)"}))
                        await ws.close(code=1008, message=b"too many refused messages")
                    except (ConnectionError, RuntimeError):  # the client is already gone
                        pass
                    break
        except ConnectionError:  # the client went away while the socket was writing to it
            log.debug("live: a client's connection was lost")
        finally:
            self.hub.remove(client)
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            if client.rtc is not None:
                await client.rtc.close()
        return ws

    def _handle(self, data, client: Client, limiter: RateLimiter, context: dict) -> str | None:
        """Apply one client message; returns the error line to send back, or None."""
        try:
            if not limiter.allow():
                raise ProtocolError("rate limit: too many messages; slow down")
            cmd = parse_message(data, context)
            if cmd.type == "ping":
                client.reply(json.dumps({"type": "pong", "t": cmd.args["t"]}))
            elif cmd.type == "passes":
                (client.wants.add if cmd.args["on"] else client.wants.discard)("passes")
            elif cmd.type in ("webrtc", "answer"):
                self._rtc_command(cmd, client)
            else:
                problem = self.page.command(cmd)
                if problem:
                    raise ProtocolError(problem)
        except ProtocolError as err:
            return str(err)
        except Exception as err:  # a bug, not the client's fault: say so, keep the socket and the renderer
            log.error("live: a client message could not be handled: %s", err, exc_info=True)
            return f"the server could not handle that message ({type(err).__name__}); nothing changed"
        return None

    # ---- WebRTC signalling (webrtc.py) -------------------------------------------------------

    def _rtc_command(self, cmd, client: Client) -> None:
        """webrtc on/off and the page's answer; refusals raise ProtocolError, the async part runs as a task."""
        peer = client.rtc
        if cmd.type == "webrtc" and not cmd.args["on"]:
            if peer is not None:
                self._rtc_task(peer.close())
            return
        if self.webrtc_reason is not None:
            raise ProtocolError(f"{cmd.type}: this server has no WebRTC ({self.webrtc_reason}); "
                                f"video stays JPEG over WebSocket")
        if cmd.type == "webrtc":
            if peer is not None:
                raise ProtocolError("webrtc: a peer connection is already open or being set up; "
                                    "send {\"type\": \"webrtc\", \"on\": false} first")
            if sum(c.rtc is not None for c in self.hub.clients) >= MAX_PEERS:
                raise ProtocolError(f"webrtc: {MAX_PEERS} viewers are on WebRTC already (the limit); "
                                    f"video stays JPEG over WebSocket")
            client.rtc = peer = webrtc.RtcPeer(client, loopback=self.host in webrtc.LOOPBACK_HOSTS,
                                               on_state=lambda p: self._rtc_state(client, p))
            self._rtc_task(self._rtc_offer(client, peer))
        else:
            if peer is None or peer.state != "offered":
                raise ProtocolError("answer: no WebRTC offer is waiting for an answer; "
                                    "send {\"type\": \"webrtc\", \"on\": true} first")
            self._rtc_task(self._rtc_answer(client, peer, cmd.args["sdp"]))

    def _rtc_task(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._rtc_tasks.add(task)
        task.add_done_callback(self._rtc_tasks.discard)

    @staticmethod
    def _rtc_failed(client: Client, what: str, err: Exception) -> None:
        line = " ".join(f"{type(err).__name__}: {err}".split())[:160]
        client.reply(json.dumps({"type": "error", "message": f"{what} ({line}); video stays JPEG over WebSocket"}))

    async def _rtc_offer(self, client: Client, peer) -> None:
        try:
            sdp = await peer.offer()
        except Exception as err:  # aiortc could not set up (no usable address, ...)
            log.warning("live: a WebRTC offer failed: %s", err)
            await peer.close()
            self._rtc_failed(client, "webrtc: the server could not make an offer", err)
            return
        if peer.state == "offered":
            client.reply(json.dumps({"type": "offer", "sdp": sdp}))

    async def _rtc_answer(self, client: Client, peer, sdp: str) -> None:
        try:
            await peer.answer(sdp)
        except Exception as err:  # SDP that passed protocol.py's checks but that aiortc cannot use
            await peer.close()
            self._rtc_failed(client, "answer: the SDP could not be used", err)

    def _rtc_state(self, client: Client, peer) -> None:
        """A peer connected (its JPEG frames stop) or ended (they resume); the page hears of it."""
        if client.rtc is not peer:
            return
        if peer.state == "connected":
            client.wants.discard("rgb")
            client.wants.add("video")
        elif peer.state in ("failed", "closed"):
            client.wants.discard("video")
            client.wants.add("rgb")
            client.rtc = None
            if peer.state == "failed":  # ICE found no pair: the answer's candidates were unusable
                client.reply(json.dumps({"type": "error", "message": "webrtc: the connection failed (no usable ICE "
                                         "candidate in the answer); video stays JPEG over WebSocket"}))
                self._rtc_task(peer.close())
        client.reply(json.dumps({"type": "webrtc", "state": peer.state}))

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(STATUS_PERIOD)
            self._send_status()

    def _send_status(self) -> None:
        """Every viewer's and engine's status (a function, so that no session outlives its end as a local)."""
        status = self.page.status()
        engines = {sid: link.session.status() for sid, link in self.sessions.items()}
        sessions = [{"session": 0, "kind": status["source"], "fps": status["fps"], "frames": status["frames"],
                     "size": status["size"]}]
        sessions += [{k: s[k] for k in ("session", "kind", "fps", "frames", "size")} for s in engines.values()]
        self.hub.broadcast_status(lambda c: json.dumps(
            {"type": "status", **status, "dropped": c.dropped, "sent": c.sent, "viewers": len(self.hub.clients),
             "video": "webrtc" if "video" in c.wants else "jpeg", "sessions": sessions}))
        for sid, link in list(self.sessions.items()):
            link.outbox.offer_status(json.dumps({"type": "status", **engines[sid], "prompt": link.session.prompt,
                                                 "inflight": link.received - link.outbox.answered,
                                                 "sessions": sessions}))

    # ---- engine sessions (/engine) ----------------------------------------------------------

    def _initial_prompt(self) -> str:
        c = self.page.config
        return c.prompt or self.page.presets[c.preset].prompt

    async def _engine_ws(self, request: web.Request) -> web.StreamResponse:
        if not self._origin_ok(request):
            raise web.HTTPForbidden(text="cross-origin WebSocket refused")
        if self.make_renderer is None:
            raise web.HTTPNotFound(text="this server takes no engine sessions")
        ws = web.WebSocketResponse(max_msg_size=wire.MAX_MESSAGE_BYTES, heartbeat=20.0, compress=False)
        await ws.prepare(request)
        token = request.query.get("resume")
        if token is None:
            link = await self._open_engine(ws)
        else:
            link = await self._resume_engine(ws, token, request.query.get("have", ""))
        if link is None:  # refused, in one line
            return ws
        await self._serve_engine(ws, link)
        return ws

    async def _open_engine(self, ws) -> EngineLink | None:
        """A new engine session on this socket, or None (refused: too many sessions)."""
        if 1 + len(self.sessions) >= self.max_sessions:  # the page's stream is one; kept sessions count
            await self._refuse_engine(
                ws, f"too many sessions: {self.max_sessions} of {self.max_sessions} are in use (the page's stream "
                    f"counts as one; serve --max-sessions); try again later", 1013, b"too many sessions")
            return None
        loop = asyncio.get_running_loop()
        self._session_ids += 1

        def emit(kind: str, payload) -> None:  # the session's render thread
            try:
                loop.call_soon_threadsafe(self._deliver, link, kind, payload)
            except RuntimeError:  # loop closed: the server is shutting down
                pass

        session = EngineSession(self._session_ids, self.make_renderer, self._initial_prompt(), emit)
        token = secrets.token_urlsafe(16) if self.resume_grace > 0 else None
        link = EngineLink(session, Outbox(ws.send_bytes, ws.send_str), token)
        self.sessions[session.id] = link
        if token is not None:
            self._resumable[token] = link
        link.ws, link.pump = ws, asyncio.ensure_future(link.outbox.pump())
        session.start()
        return link

    def _deliver(self, link: EngineLink, kind: str, payload) -> None:
        """What a session's render thread emits, on the loop thread."""
        if kind == "frame" or kind == "frame_error" and "frame" in json.loads(payload):  # an answer, in order
            link.outbox.frame(payload)
        elif kind == "frame_error":  # an error naming no frame (a light the renderer refused): no answer
            link.outbox.reply(payload)
        elif kind == "hello":
            resume = {"resume": link.token, "resume_grace": self.resume_grace} if link.token else {"resume_grace": 0}
            link.hello = {**json.loads(payload), **resume}
            link.outbox.keep_written(link.session.max_inflight if link.token else 0)
            link.outbox.reply(json.dumps(link.hello))
        elif kind == "failed":
            link.ended = json.loads(payload)["message"]
            if link.ws is not None:
                asyncio.ensure_future(self._close_engine(link, payload, 1011, b"session failed"))
            else:  # dropped: a resume hears why until the grace period ends
                self._end_engine(link, keep_token=True)

    async def _serve_engine(self, ws, link: EngineLink) -> None:
        """Read one socket's messages into its session until it closes; a dropped connection (no close
        frame) keeps the session for --resume-grace seconds, any other end ends it."""
        limiter, strikes, dropped = RateLimiter(), 0, False
        context = {"presets": list(self.page.presets), "types": ENGINE_TYPES}
        try:
            while True:
                msg = await ws.receive()
                if msg.type in (WSMsgType.CLOSED, WSMsgType.ERROR):  # no close frame: the connection dropped
                    dropped = not isinstance(msg.data, WebSocketError)  # (a message over the limit is no drop)
                    break
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break  # a close frame: the engine (or this server) ended the session
                problem = self._handle_engine(msg, link, limiter, context)
                if problem is None:
                    strikes = 0
                    continue
                strikes += 1
                text, frame = problem
                link.outbox.reply(json.dumps({"type": "error", "message": text,
                                              **({"frame": frame} if frame is not None else {})}),
                                  answer=frame is not None)  # a frame's refusal is its answer
                if strikes >= MAX_STRIKES:
                    await self._close_engine(link, json.dumps(
                        {"type": "error", "fatal": True, "message": f"{text} (closing after {strikes} refused messages)"}),
                        1008, b"too many refused messages")
                    break
        except ConnectionError:
            dropped = True
        finally:
            if link.ws is ws:  # (else a resume took the session to another socket)
                if dropped and link.token and link.ended is None and not self._stopping:
                    await self._park(link)
                else:
                    self._end_engine(link)

    def _handle_engine(self, msg, link: EngineLink, limiter: RateLimiter,
                       context: dict) -> tuple[str, int | None] | None:
        """Apply one engine message; returns (error line, frame number or None) to send back, or None."""
        try:
            if msg.type == WSMsgType.BINARY:  # frames are bounded by the in-flight cap, not the rate limit
                pending = link.received - link.outbox.answered
                try:
                    message = wire.unpack_gbuffers(msg.data)
                except wire.FrameError:
                    link.received += 1  # its number is readable: it gets one answer, as an admitted frame does
                    raise
                link.received += 1
                link.session.admit(message, pending)
                return None
            if not limiter.allow():
                raise ProtocolError("rate limit: too many messages; slow down")
            cmd = parse_message(msg.data, context)
            if cmd.type == "ping":
                link.outbox.reply(json.dumps({"type": "pong", "t": cmd.args["t"]}))
            elif cmd.type == "prompt":
                link.session.offer_prompt(cmd.args["text"])
            elif cmd.type == "preset":
                link.session.offer_prompt(self.page.presets[cmd.args["name"]].prompt)
            elif cmd.type == "light":
                link.session.offer_light(cmd.args["light"])
        except ProtocolError as err:
            return str(err), getattr(err, "frame", None)
        except Exception as err:  # a bug: say so, keep the socket, the session and the others
            log.error("live: an engine message could not be handled: %s", err, exc_info=True)
            return f"the server could not handle that message ({type(err).__name__}); nothing changed", None
        return None

    async def _park(self, link: EngineLink) -> None:
        """The socket dropped: keep the session (its render thread goes on, its answers wait in the
        outbox) for resume_grace seconds under its token."""
        link.ws = None
        link.expiry = asyncio.get_running_loop().call_later(self.resume_grace, self._expire, link)  # (a resume cancels it)
        link.pump.cancel()
        await asyncio.gather(link.pump, return_exceptions=True)
        log.info("live: engine session %d dropped its connection; kept %g s for a resume", link.session.id,
                 self.resume_grace)

    def _expire(self, link: EngineLink) -> None:
        self._resumable.pop(link.token, None)
        if link.ws is None:
            log.info("live: engine session %d was not resumed within %g s; ended", link.session.id, self.resume_grace)
            self._end_engine(link)

    async def _resume_engine(self, ws, token: str, have: str) -> EngineLink | None:
        """Attach a kept session to this socket: its hello again (with `received`, the frames the server
        has), then the answers after the client's `have` and the rest. None when refused (one line)."""
        link = self._resumable.get(token)
        problem = None
        if link is None:
            problem = (f"resume: no session to resume with this token (unknown, or not resumed within the "
                       f"{self.resume_grace:g} s the server keeps a dropped session: serve --resume-grace); "
                       f"connect without it for a new session")
        elif link.ended is not None:
            problem = f"resume: {link.ended}"
        elif not have.isdigit():
            problem = f"resume: have={have[:20]!r} must be the number of answers (frames and frame errors) received"
        elif link.hello is None:
            problem = f"resume: session {link.session.id} has not started yet (no hello was sent)"
        if problem is not None:
            await self._refuse_engine(ws, problem, 1008, b"resume refused")
            return None
        old, link.ws = link.ws, ws  # first: the old socket's reader no longer owns the session
        if link.expiry is not None:
            link.expiry.cancel()
            link.expiry = None
        link.pump.cancel()
        await asyncio.gather(link.pump, return_exceptions=True)
        if old is not None:  # its drop not noticed yet (or a second client with the token): this one wins
            asyncio.ensure_future(old.close(code=1008, message=b"resumed elsewhere"))
        problem = link.outbox.attach(ws.send_bytes, ws.send_str, int(have))
        if problem is not None:
            link.ended = f"resume: {problem}"
            await self._refuse_engine(ws, link.ended, 1008, b"resume refused")
            self._end_engine(link)
            return None
        link.outbox.reply(json.dumps({**link.hello, "resumed": True, "received": link.received}))
        link.pump = asyncio.ensure_future(link.outbox.pump())
        log.info("live: engine session %d resumed (%d frames received, %d answers written again)", link.session.id,
                 link.received, len(link.outbox.frames))
        return link

    async def _refuse_engine(self, ws, message: str, code: int, reason: bytes) -> None:
        try:
            await ws.send_str(json.dumps({"type": "error", "fatal": True, "message": message}))
            await ws.close(code=code, message=reason)
        except (ConnectionError, RuntimeError):  # already gone
            pass

    def _end_engine(self, link: EngineLink, keep_token: bool = False) -> None:
        """Stop a session for good (its render thread ends after its current chunk; its state goes with it)."""
        self.sessions.pop(link.session.id, None)
        if not keep_token:
            self._resumable.pop(link.token, None)
            if link.expiry is not None:
                link.expiry.cancel()
                link.expiry = None
        link.session.close()
        link.outbox.close()
        if link.pump is not None:
            link.pump.cancel()

    async def _close_engine(self, link: EngineLink, text: str, code: int, reason: bytes) -> None:
        """Say why, then close an engine's socket (its pump stopped first: one writer per socket); the
        session ends with it."""
        link.ended = link.ended or json.loads(text)["message"]
        link.outbox.close()
        link.pump.cancel()
        await asyncio.gather(link.pump, return_exceptions=True)
        if link.ws is not None:
            await self._refuse_engine(link.ws, json.loads(text)["message"], code, reason)

    # ---- lifecycle --------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._check_host, self._check_token])
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/engine", self._engine_ws)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.hub = Hub(asyncio.get_running_loop())
        self.page = self.page_factory(self.hub)
        self.page.start()
        self._status_task = asyncio.ensure_future(self._status_loop())

    async def _on_shutdown(self, app: web.Application) -> None:
        self._status_task.cancel()
        peers = [c.rtc for c in self.hub.clients if c.rtc is not None]
        for client in list(self.hub.clients):
            self.hub.remove(client)
        await asyncio.gather(*(peer.close() for peer in peers), *self._rtc_tasks, return_exceptions=True)
        self._stopping = True
        links = list(self.sessions.values())
        stopping = json.dumps({"type": "error", "fatal": True, "message": "the server is stopping"})
        await asyncio.gather(*(asyncio.wait_for(self._close_engine(link, stopping, 1001, b"server stopping"), 2.0)
                               for link in links if link.ws is not None), return_exceptions=True)
        for link in links:
            self._end_engine(link)
        sessions = [link.session for link in links]

        def stop_all():
            self.page.stop()
            for session in sessions:  # each ends after its current chunk
                session.join()

        await asyncio.get_running_loop().run_in_executor(None, stop_all)

    async def _main(self) -> None:
        socks = listening_sockets(self.host, self.port)  # first: a port in use fails before the page starts
        runner = web.AppRunner(self.make_app(), access_log=None)
        try:
            await runner.setup()
            for sock in socks:
                await web.SockSite(runner, sock).start()
            port = socks[0].getsockname()[1]
            self.url = f"http://{self.host}:{port}/"
            self._stopped = asyncio.Event()
            self._started.set()
            await self._stopped.wait()
        finally:
            await runner.cleanup()
            for sock in socks:  # (closed already by a site that started)
                sock.close()

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        async def main():
            task = asyncio.ensure_future(self._main())
            while not self._started.is_set() and not task.done():
                await asyncio.sleep(0.05)
            if on_ready and self._started.is_set():
                on_ready(self.url)
            await task

        try:
            asyncio.run(main())
        finally:  # also on Ctrl-C / SIGTERM (cli: Stopped) arriving anywhere in the loop: finish a recording
            if self.page is not None:
                self.page.stop()

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
