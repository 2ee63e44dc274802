"""An engine's side of the live server (`alaya-flash serve`): send G-buffer frames, get rendered frames back.

    from alaya_flash.client import Client

    with Client("http://127.0.0.1:8765/", prompt="a rainy street at night") as client:
        for n, gbuffers in enumerate(my_engine_frames()):   # uint8 (5, H, W, 3) teacher form,
            client.send(n, gbuffers)                        # or float passes (a mapping / GBufferFrame)
            for frame in client.poll():                     # rendered so far, in order; never waits
                show(frame.image)                           # uint8 (H, W, 3) RGB, frame.number = n
        client.set_prompt("a snowy street")                 # renders from the next chunk at the latest
        client.send(n + 1, gbuffers, light={"sun_azimuth": 90, "sun_elevation": 20})  # this frame on: the engine's sun
        client.set_light(None)                              # back to the prompt's light
        client.send(n + 2, gbuffers, shadow=sun_mask, sky=sky_seen)  # the engine's light passes: uint8 (H, W)
        frame = client.receive()                            # waits for the next frame

    async with AsyncClient(url) as client:                  # the same verbs, as coroutines
        await client.send(n, gbuffers)
        frame = await client.receive()

Each client is one session on the server: its own stream state (KV cache, codec memories,
prompt) on the weights the server loaded once. Frames come back in the order they were sent,
each once, as a `Frame` with the engine's frame number, its send time echoed (round_trip_ms) and
the server's timings. Flow control: send() waits while `max_inflight` frames (the server's
hello says how many) are sent and not yet back (a frame the server refuses, see `errors`, is
back); frames that are back wait in an inbox for receive() or poll(). The inbox keeps at most
`keep` frames: an engine that never reads loses the oldest (counted in `dropped`), not memory.

A light (where the engine's sun is) goes with a frame, `send(..., light=...)`, or alone, `set_light`:
a dict of Light fields (sun_azimuth, sun_elevation, sun_color, ...; docs/lighting.md), its short form
("sunset_dramatic,az=90,el=20"), an object with to_dict() (alaya_flash.model_zoo.light.Light), or None
for the prompt's light; it renders from the next frame sent, exactly. The server checks it and answers
a wrong one (an unknown key, NaN, an elevation outside [-90, 90], a model that reads no light) with an
error line in `errors`; `hello["reads_light"]` says whether this session's model reads a light at all.

An engine that knows its shadows (its shadow maps) sends them with each frame, `send(..., shadow=...)`:
the sun's visibility per pixel, uint8 (H, W) 255 where the sun reaches and 0 in its shadow (or float
in [0, 1]), at the G-buffers' size; and its sky occlusion, `send(..., sky=...)`: the share of the sky
each pixel's surface sees, 255 all of it, 0 none (a room's walls and ceiling block it). The shading
prior then takes its shadows and its ambient occlusion from them instead of screen-space ones, which
cannot see what is off the screen. A session sends each with every frame or never: a frame that
breaks this is refused with an error line in `errors`.

A dropped connection does not lose the session: the server keeps it for a grace period (the
hello's resume_grace, `serve --resume-grace`), and the client reconnects with backoff and resumes
it with the hello's token. The server writes again the answers the client did not get, and the
client sends again the frames (and prompts) the server did not get, so every frame is rendered
once and comes back once, in order, exactly as without the drop (`resumes` counts them). A drop
that cannot be resumed in time raises ClientError with the server's line.

Standard library, aiohttp and numpy only: importing this module does not import torch.
docs/live.md, "Engine ingest", describes the protocol byte by byte.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit, urlunsplit

import numpy as np

from .streaming.live.wire import MAX_MESSAGE_BYTES, pack_gbuffers, unpack_frame

log = logging.getLogger(__name__)

__all__ = ["AsyncClient", "Client", "ClientError", "Frame", "engine_url"]

MAX_ERRORS = 64  # server refusals kept in `errors` (the oldest go first)
BACKOFF = (0.05, 2.0)  # seconds between attempts to resume a dropped session: the first, doubling to the last


class ClientError(Exception):
    """The session cannot go on: refused (too many sessions, a bad URL), stopped by the server, or closed."""


@dataclass(frozen=True)
class Frame:
    """One rendered frame. image: uint8 (H, W, 3) RGB (read-only). sent: the time given with its
    G-buffers; received: time.perf_counter() when it arrived. timings: the server's milliseconds:
    wait_ms (received -> its chunk's render began: the rest of the chunk arriving), turn_ms (waiting
    for the shared weights), render_ms (the chunk's render), server_ms (received -> sent back)."""

    number: int
    image: np.ndarray
    sent: float
    received: float
    index: int  # position in this session's stream
    timings: dict = field(default_factory=dict)

    @property
    def round_trip_ms(self) -> float:
        """Send to receipt, when `sent` was the default (time.perf_counter() at send)."""
        return 1000 * (self.received - self.sent)


def light_message(light) -> str:
    """The light message (docs/live.md): a dict of Light fields, its short form, an object with to_dict()
    (model_zoo.light.Light), or None (the prompt's light). The server checks the values."""
    if hasattr(light, "to_dict"):
        light = light.to_dict()
    if light is not None and not isinstance(light, (dict, str)):
        raise TypeError(f"light must be a dict of Light fields, its short form, a Light or None, got {type(light).__name__}")
    return json.dumps({"type": "light", "light": light})


def engine_url(url: str) -> str:
    """The server's page address (http://host:port/) or its ws:// address -> the /engine WebSocket URL."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ClientError(f"{url!r} is not a server address (http://HOST:PORT/ as `alaya-flash serve` prints it)")
    path = parts.path if parts.path.rstrip("/").endswith("/engine") else parts.path.rstrip("/") + "/engine"
    token = [q for q in parts.query.split("&") if q.startswith("token=")]  # a server's ?token= travels along
    return urlunsplit((scheme, parts.netloc, path, token[0] if token else "", ""))


class AsyncClient:
    """One engine session over asyncio. Use `async with AsyncClient(url) as c:` or `await c.connect()`."""

    def __init__(self, url: str, prompt: str | None = None, timeout: float = 120.0, keep: int = 256,
                 reconnect: float | None = None):
        """prompt: the session's prompt from its first frame (default: the server's).
        timeout: seconds connect() waits for the session (the server may load the model first)
        and send()/receive() wait by default. keep: frames the inbox holds (the oldest go first).
        reconnect: seconds to keep trying to resume the session after its connection drops (None: as
        long as the server keeps it, the hello's resume_grace; 0: a drop ends the session)."""
        if keep < 1:
            raise ValueError(f"keep={keep} must be at least 1")
        self.url, self.prompt, self.timeout, self.keep = engine_url(url), prompt, timeout, keep
        self.reconnect = reconnect
        self.resumes = 0  # times the session was resumed after its connection dropped
        self.dropped = 0  # frames the inbox let go unread (it was full)
        self.hello: dict = {}  # the server's: session, chunk_frames, max_inflight, limits, prompt
        self.status: dict = {}  # the latest status: fps, frames, latency_ms, inflight, sessions, ...
        self.errors: deque[str] = deque(maxlen=MAX_ERRORS)  # refusals of frames or messages
        self._inbox: deque[Frame] = deque()
        self._sent = self._back = 0  # frames sent; frames back (arrived or refused)
        self._refused = 0  # frames the server answered with an error (no chunk holds them)
        self._failure: str | None = None
        self._http = self._ws = self._reader = None
        self._cond: asyncio.Condition | None = None
        # what a resume may have to send again: (frames sent before it, "frame" | "prompt" | "light",
        # the message); entries before the _back-th frame are known to be at the server
        self._unsure: deque[tuple[int, str, bytes | str]] = deque()
        self._send_lock: asyncio.Lock | None = None  # one writer: a resume's resends, then new sends
        self._live = False  # the socket is up: sends go out now (else a resume sends them)
        self._closing = False

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def max_inflight(self) -> int:
        return int(self.hello.get("max_inflight", 1))

    @property
    def _resumable(self) -> bool:
        """Whether a drop will be resumed, so what is sent is kept until the server is known to have it
        (at most max_inflight frames: each until it is back)."""
        return bool(self.hello.get("resume")) and self.reconnect != 0

    async def connect(self) -> "AsyncClient":
        import aiohttp

        self._cond, self._send_lock = asyncio.Condition(), asyncio.Lock()
        self._http = aiohttp.ClientSession()
        try:
            self._ws = await self._open(self.url, self.timeout)
        except ClientError:
            await self._http.close()
            raise
        self._live = True
        self._reader = asyncio.ensure_future(self._read())
        try:
            await self._wait(lambda: self.hello or self._failure, self.timeout, "the server's hello")
            self._check()
        except ClientError:
            await self.close()
            raise
        if self.prompt:
            await self.set_prompt(self.prompt)
        return self

    async def send(self, number: int, gbuffers, depth_near: float = 0.0, sent: float | None = None,
                   timeout: float | None = None, light=None, shadow=None, sky=None) -> None:
        """Send one G-buffer frame: uint8 (5, H, W, 3) teacher form, or float32 passes (albedo, depth,
        metallic, normal, roughness; depth_near scales their depth, 0 = 0.5). Every frame of a session
        has the first one's size. Waits while max_inflight frames are at the server. light: the light
        from this frame on (as set_light takes it; None: unchanged). shadow, sky: the frame's light passes,
        uint8 (H, W) 255 = seen (where the sun reaches; the whole sky), or float (H, W) in [0, 1]; each with
        every frame or never."""
        data = pack_gbuffers(number, time.perf_counter() if sent is None else sent, gbuffers, depth_near, shadow, sky)
        await self._wait(lambda: self._sent - self._back < self.max_inflight or self._failure,
                         self.timeout if timeout is None else timeout,
                         f"room to send frame {number} ({self.max_inflight} frames are at the server)")
        self._check()
        async with self._send_lock:
            if light is not None:
                await self._say("light", light_message(light))
            if self._resumable:
                self._unsure.append((self._sent, "frame", data))
            self._sent += 1
            await self._write(data)

    async def receive(self, timeout: float | None = None) -> Frame:
        """The next rendered frame, in send order (waits for it). Refused at once when every frame that
        can come back has: the server renders whole chunks, so the rest wait for their chunk's last frame."""
        if not self._inbox and not self._failure and self._back >= self.renderable():
            raise ClientError(f"no frame can come back yet: {self._sent - self._back} sent frame(s) wait for the "
                              f"rest of their chunk (the server renders {self.hello.get('chunk_frames')} frames at a "
                              f"time after the first {self.hello.get('first_chunk_frames')}); send more frames first")
        await self._wait(lambda: self._inbox or self._failure, self.timeout if timeout is None else timeout,
                         "a rendered frame")
        if not self._inbox:
            self._check()
        return self._take()

    def renderable(self) -> int:
        """How many of the frames sent so far can come back: those of completed chunks (the hello's
        first_chunk_frames, then chunk_frames each) less the held_frames a renderer returns with the next
        chunk, plus every refused frame (its error comes back)."""
        first = int(self.hello.get("first_chunk_frames", self.hello.get("chunk_frames", 1)))
        steady = max(1, int(self.hello.get("chunk_frames", 1)))
        valid = self._sent - self._refused
        whole = 0 if valid < first else first + (valid - first) // steady * steady
        return max(0, whole - int(self.hello.get("held_frames", 0))) + self._refused

    def poll(self) -> list[Frame]:
        """Every frame that has arrived, in order; [] when none (never waits)."""
        out = []
        while self._inbox:
            out.append(self._take())
        if not out:
            self._check()
        return out

    async def set_prompt(self, text: str) -> None:
        """A new prompt: it renders from the first chunk that starts after it reaches the server (the
        stream goes on: no cut)."""
        self._check()
        async with self._send_lock:
            await self._say("prompt", json.dumps({"type": "prompt", "text": text}))

    async def set_light(self, light) -> None:
        """The light from the next frame sent on: a dict of Light fields, its short form, an object with
        to_dict(), or None for the prompt's light (module docstring)."""
        self._check()
        async with self._send_lock:
            await self._say("light", light_message(light))

    async def close(self) -> None:
        self._closing = True
        if self._reader is not None and not self._live:  # trying to resume: stop trying
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
        self._failure = self._failure or "the client is closed"

    # ---- internals ----------------------------------------------------------------------------

    def _take(self) -> Frame:
        return self._inbox.popleft()

    def _check(self) -> None:
        if self._failure:
            raise ClientError(self._failure)

    async def _wait(self, ready, timeout: float, what: str) -> None:
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(ready), timeout)
            except asyncio.TimeoutError:
                raise ClientError(f"no {what} after {timeout:g} s") from None

    async def _open(self, url: str, timeout: float):
        import aiohttp

        try:
            return await asyncio.wait_for(
                self._http.ws_connect(url, max_msg_size=MAX_MESSAGE_BYTES, heartbeat=20.0), timeout)
        except asyncio.TimeoutError:
            raise ClientError(f"{self.url}: cannot open an engine session (no answer within {timeout:g} s)") from None
        except (aiohttp.ClientError, OSError) as err:
            raise ClientError(f"{self.url}: cannot open an engine session ({err})") from None

    async def _say(self, kind: str, message: str) -> None:
        """A prompt or light message (it applies from the next frame sent), kept for a resume until the
        server is known to have it. Of one kind with no frame between only the last counts (so the
        server takes them), so only that one is kept. Call with _send_lock held."""
        if self._resumable:
            self._unsure = deque(e for e in self._unsure if e[:2] != (self._sent, kind))
            self._unsure.append((self._sent, kind, message))
        await self._write(message)

    async def _write(self, data: bytes | str) -> None:
        """Send on the socket if it is up; a send into a dropped connection is left to the resume."""
        import aiohttp

        if not self._live:
            return
        try:
            await (self._ws.send_bytes(data) if isinstance(data, bytes) else self._ws.send_str(data))
        except (ConnectionError, aiohttp.ClientError):  # the reader sees the drop; the resume sends it again
            pass

    async def _read(self) -> None:
        try:
            while await self._read_socket() and await self._resume():
                pass
        finally:
            self._live = False
            self._failure = self._failure or f"the server closed the session (code {self._ws.close_code})"
            async with self._cond:
                self._cond.notify_all()

    async def _read_socket(self) -> bool:
        """Read the socket until it ends; True when the connection dropped (no close frame) and the
        session may be resumed."""
        import aiohttp

        while True:
            msg = await self._ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                self._back += 1
                if len(self._inbox) >= self.keep:
                    if not self.dropped:
                        log.warning("alaya-flash client: the inbox is full (%d frames): dropping the oldest; "
                                    "call receive() or poll()", self.keep)
                    self._inbox.popleft()
                    self.dropped += 1
                self._inbox.append(self._frame(msg.data))
            elif msg.type == aiohttp.WSMsgType.TEXT:
                self._text(json.loads(msg.data))
            else:  # CLOSED / ERROR without a close frame: dropped; CLOSE: the server (or this client) ended it
                return (msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
                        and not isinstance(msg.data, aiohttp.WebSocketError) and not self._closing
                        and not self._failure)
            while self._unsure and self._unsure[0][0] < self._back:  # the server has these
                self._unsure.popleft()
            async with self._cond:
                self._cond.notify_all()

    async def _resume(self) -> bool:
        """The connection dropped: reconnect with the session's resume token, with backoff, until
        `reconnect` seconds have passed; on the server's hello, send again what it has not received.
        True once resumed (self._ws is the new socket); False with _failure set."""
        self._live = False
        token = self.hello.get("resume")
        budget = float(self.hello.get("resume_grace", 0)) if self.reconnect is None else self.reconnect
        session = self.hello.get("session")
        if not self._resumable or budget <= 0:
            self._failure = (f"the connection to session {session} dropped and this client does not resume it"
                             + ("" if token else " (the server keeps no dropped session: serve --resume-grace)"))
            return False
        log.warning("alaya-flash client: the connection to session %s dropped; resuming it", session)
        deadline, delay, last = time.monotonic() + budget, BACKOFF[0], "no attempt"
        while time.monotonic() < deadline:
            query = urlencode({"resume": token, "have": self._back})
            url = self.url + ("&" if urlsplit(self.url).query else "?") + query
            try:
                ws = await self._open(url, min(self.timeout, max(0.1, deadline - time.monotonic())))
            except ClientError as err:
                last = str(err)
            else:
                hello = await self._resumed_hello(ws, min(self.timeout, max(1.0, deadline - time.monotonic())))
                if isinstance(hello, dict):
                    return await self._send_again(ws, hello)
                if hello.startswith("resume:"):  # the server's refusal: trying again will not help
                    self._failure = f"the connection dropped and the session could not be resumed: {hello}"
                    return False
                last = hello
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(2 * delay, BACKOFF[1])
        self._failure = (f"the connection to session {session} dropped and could not be resumed within "
                         f"{budget:g} s (the last try: {last})")
        return False

    async def _resumed_hello(self, ws, timeout: float) -> dict | str:
        """The new socket's first message: the resumed hello (a dict), or what went wrong (a line)."""
        import aiohttp

        try:
            msg = await ws.receive(timeout)
        except asyncio.TimeoutError:
            problem = f"no hello within {timeout:g} s"
        except (aiohttp.ClientError, ConnectionError) as err:
            problem = str(err)
        else:
            if msg.type != aiohttp.WSMsgType.TEXT:
                problem = f"the socket closed before the hello (code {ws.close_code})"
            else:
                reply = json.loads(msg.data)
                if reply.get("type") == "hello" and reply.get("resumed"):
                    return reply
                problem = str(reply.get("message", f"an unexpected {reply.get('type')!r} message"))
        await ws.close()
        return problem

    async def _send_again(self, ws, hello: dict) -> bool:
        """Resumed: send again every frame and prompt the server has not received (hello["received"]
        frames), in order, before any new send; then the new socket takes over."""
        received = int(hello.get("received", -1))
        async with self._send_lock:
            if not self._back <= received <= self._sent:
                await ws.close()
                self._failure = (f"the session was resumed, but the server has {received} of the {self._sent} "
                                 f"frames sent and {self._back} are back; cannot go on")
                return False
            old, self._ws, self.hello = self._ws, ws, hello
            self._live = True
            for number, _, data in self._unsure:
                if number >= received:  # a prompt or light before frame `received` too: again, it changes nothing
                    await self._write(data)
        await old.close()
        self.resumes += 1
        log.warning("alaya-flash client: session %s resumed (%d frame(s) sent again)", hello.get("session"),
                    self._sent - received)
        return True

    def _frame(self, data: bytes) -> Frame:
        header, pixels = unpack_frame(data)
        h, w = header["height"], header["width"]
        image = np.frombuffer(pixels, np.uint8).reshape(h, w, 3)
        return Frame(header["frame"], image, header["sent"], time.perf_counter(), header["index"],
                     header.get("timings", {}))

    def _text(self, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "hello":
            self.hello = msg
        elif kind == "status":
            self.status = msg
        elif kind == "error":
            if msg.get("fatal"):
                self._failure = msg["message"]
                return
            if "frame" in msg:  # that frame will not come back
                self._back += 1
                self._refused += 1
            self.errors.append(msg["message"])
            log.warning("alaya-flash server: %s", msg["message"])


class Client:
    """One engine session, blocking: the AsyncClient's verbs on a private event loop thread.

    Client(url, prompt=None, timeout=120, keep=256, reconnect=None) connects at once (raises ClientError
    when refused); a dropped connection is resumed as AsyncClient's.
    """

    def __init__(self, url: str, prompt: str | None = None, timeout: float = 120.0, keep: int = 256,
                 reconnect: float | None = None):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="alaya-flash-client", daemon=True)
        self._thread.start()
        self._async = AsyncClient(url, prompt=prompt, timeout=timeout, keep=keep, reconnect=reconnect)
        try:
            self._call(self._async.connect())
        except BaseException:
            self._stop_loop()
            raise

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def hello(self) -> dict:
        return self._async.hello

    @property
    def status(self) -> dict:
        return self._async.status

    @property
    def errors(self) -> deque[str]:
        return self._async.errors

    @property
    def max_inflight(self) -> int:
        return self._async.max_inflight

    @property
    def dropped(self) -> int:
        return self._async.dropped

    @property
    def resumes(self) -> int:
        return self._async.resumes

    def send(self, number: int, gbuffers, depth_near: float = 0.0, sent: float | None = None,
             timeout: float | None = None, light=None, shadow=None, sky=None) -> None:
        """As AsyncClient.send: one G-buffer frame (with its light passes, and the light from it on, when
        given); waits while max_inflight frames are at the server."""
        self._call(self._async.send(number, gbuffers, depth_near, sent, timeout, light, shadow, sky))

    def set_light(self, light) -> None:
        """The light from the next frame sent on (None: the prompt's), as AsyncClient.set_light."""
        self._call(self._async.set_light(light))

    def receive(self, timeout: float | None = None) -> Frame:
        """The next rendered frame, in send order (waits for it)."""
        return self._call(self._async.receive(timeout))

    def renderable(self) -> int:
        """How many of the frames sent so far can come back (AsyncClient.renderable)."""
        return self._async.renderable()

    def poll(self) -> list[Frame]:
        """Every frame that has arrived, in order; [] when none (never waits)."""

        async def poll():
            return self._async.poll()

        return self._call(poll())

    def set_prompt(self, text: str) -> None:
        """A new prompt, rendered from the first chunk that starts after it reaches the server."""
        self._call(self._async.set_prompt(text))

    def close(self) -> None:
        if self._loop.is_running():
            try:
                self._call(self._async.close())
            finally:
                self._stop_loop()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
