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
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from .streaming.live.wire import MAX_MESSAGE_BYTES, pack_gbuffers, unpack_frame

log = logging.getLogger(__name__)

__all__ = ["AsyncClient", "Client", "ClientError", "Frame", "engine_url"]

MAX_ERRORS = 64  # server refusals kept in `errors` (the oldest go first)


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

    def __init__(self, url: str, prompt: str | None = None, timeout: float = 120.0, keep: int = 256):
        """prompt: the session's prompt from its first frame (default: the server's).
        timeout: seconds connect() waits for the session (the server may load the model first)
        and send()/receive() wait by default. keep: frames the inbox holds (the oldest go first)."""
        if keep < 1:
            raise ValueError(f"keep={keep} must be at least 1")
        self.url, self.prompt, self.timeout, self.keep = engine_url(url), prompt, timeout, keep
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

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def max_inflight(self) -> int:
        return int(self.hello.get("max_inflight", 1))

    async def connect(self) -> "AsyncClient":
        import aiohttp

        self._cond = asyncio.Condition()
        self._http = aiohttp.ClientSession()
        try:
            self._ws = await self._http.ws_connect(self.url, max_msg_size=MAX_MESSAGE_BYTES, heartbeat=20.0)
        except (aiohttp.ClientError, OSError) as err:
            await self._http.close()
            raise ClientError(f"{self.url}: cannot open an engine session ({err})") from None
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
                   timeout: float | None = None, light=None) -> None:
        """Send one G-buffer frame: uint8 (5, H, W, 3) teacher form, or float32 passes (albedo, depth,
        metallic, normal, roughness; depth_near scales their depth, 0 = 0.5). Every frame of a session
        has the first one's size. Waits while max_inflight frames are at the server. light: the light
        from this frame on (as set_light takes it; None: unchanged)."""
        data = pack_gbuffers(number, time.perf_counter() if sent is None else sent, gbuffers, depth_near)
        await self._wait(lambda: self._sent - self._back < self.max_inflight or self._failure,
                         self.timeout if timeout is None else timeout,
                         f"room to send frame {number} ({self.max_inflight} frames are at the server)")
        self._check()
        if light is not None:
            await self._ws.send_str(light_message(light))
        await self._ws.send_bytes(data)
        self._sent += 1

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
        await self._ws.send_str(json.dumps({"type": "prompt", "text": text}))

    async def set_light(self, light) -> None:
        """The light from the next frame sent on: a dict of Light fields, its short form, an object with
        to_dict(), or None for the prompt's light (module docstring)."""
        self._check()
        await self._ws.send_str(light_message(light))

    async def close(self) -> None:
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

    async def _read(self) -> None:
        import aiohttp

        try:
            async for msg in self._ws:
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
                else:
                    break
                async with self._cond:
                    self._cond.notify_all()
        finally:
            code = self._ws.close_code
            self._failure = self._failure or f"the server closed the session (code {code})"
            async with self._cond:
                self._cond.notify_all()

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

    Client(url, prompt=None, timeout=120, keep=256) connects at once (raises ClientError when refused).
    """

    def __init__(self, url: str, prompt: str | None = None, timeout: float = 120.0, keep: int = 256):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="alaya-flash-client", daemon=True)
        self._thread.start()
        self._async = AsyncClient(url, prompt=prompt, timeout=timeout, keep=keep)
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

    def send(self, number: int, gbuffers, depth_near: float = 0.0, sent: float | None = None,
             timeout: float | None = None, light=None) -> None:
        """As AsyncClient.send: one G-buffer frame (and the light from it on, when given); waits while
        max_inflight frames are at the server."""
        self._call(self._async.send(number, gbuffers, depth_near, sent, timeout, light))

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
