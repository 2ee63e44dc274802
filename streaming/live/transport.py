"""Frame fan-out with backpressure: one latest-frame slot per client, the renderer never waits.

    hub = Hub(loop)                         # made on the server's event loop
    client = hub.add(send_bytes, send_str)  # one per WebSocket; its sender task runs client.pump()
    hub.publish("rgb", payload)             # from the render thread; returns at once
    hub.remove(client)

Memory is bounded whatever the clients do: the hub holds at most one pending payload per kind
(the render thread overwrites it), each client holds at most one payload per kind (a newer frame
replaces an unsent one: that is a dropped frame, counted per client) plus at most MAX_REPLIES
small text replies. A client that reads nothing only stalls its own sender task, which waits on
its socket's write buffer; the hub keeps overwriting its slot.

A viewer on WebRTC (webrtc.py) wants "video" instead of "rgb": the raw frame (header, RGB array)
goes to its peer's own latest-frame slot (`client.rtc.put`), which its video encoder empties.

An engine session (ingest.py) wants every frame it sent, so its replies go through an Outbox
instead: in order, nothing replaced, bounded by the session's in-flight cap.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Awaitable, Callable

MAX_REPLIES = 16  # text replies (errors, pongs) queued per client; the oldest go first
FRAME_KINDS = ("rgb", "passes")


class Client:
    """One viewer: its latest-frame slot, its reply queue and its counters. Loop thread only."""

    def __init__(self, send_bytes: Callable[[bytes], Awaitable], send_str: Callable[[str], Awaitable]):
        self.send_bytes, self.send_str = send_bytes, send_str
        self.slot: dict[str, bytes | str] = {}  # kind -> latest unsent payload ("status" is text)
        self.replies: deque[str] = deque(maxlen=MAX_REPLIES)
        self.wants = {"rgb"}  # kinds this client receives; "passes" on request; "video" instead of rgb on WebRTC
        self.rtc = None  # its WebRTC peer (webrtc.RtcPeer), which takes the "video" frames
        self.sent = 0  # rgb frames sent
        self.dropped = 0  # rgb frames replaced before they could be sent
        self._ready = asyncio.Event()
        self.closed = False

    def offer(self, kind: str, payload: bytes | str) -> None:
        """Put a payload in the slot, replacing (and counting, for rgb) an unsent one."""
        if kind in self.slot and kind == "rgb":
            self.dropped += 1
        self.slot.pop(kind, None)  # re-insert: the slot stays in arrival order
        self.slot[kind] = payload
        self._ready.set()

    def reply(self, text: str) -> None:
        self.replies.append(text)
        self._ready.set()

    def pending(self) -> int:
        """Payloads waiting (bounded by the number of kinds + MAX_REPLIES)."""
        return len(self.slot) + len(self.replies)

    async def pump(self) -> None:
        """Send whatever is waiting, newest frame per kind, until closed. Exceptions end the pump."""
        while not self.closed:
            if not self.slot and not self.replies:
                self._ready.clear()
                await self._ready.wait()
                continue
            if self.replies:
                await self.send_str(self.replies.popleft())
                continue
            kind = next(iter(self.slot))
            payload = self.slot.pop(kind)
            if isinstance(payload, str):
                await self.send_str(payload)
            else:
                await self.send_bytes(payload)
                if kind == "rgb":
                    self.sent += 1

    def close(self) -> None:
        self.closed = True
        self._ready.set()


class Hub:
    """All clients of one server. publish() is thread-safe and never blocks."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.clients: set[Client] = set()
        self._lock = threading.Lock()
        self._pending: dict[str, bytes] = {}  # kind -> newest payload not yet fanned out
        self._scheduled = False
        self.published = 0

    def add(self, send_bytes, send_str) -> Client:
        client = Client(send_bytes, send_str)
        self.clients.add(client)
        return client

    def remove(self, client: Client) -> None:
        client.close()
        self.clients.discard(client)

    def wants(self, kind: str) -> bool:
        """Whether any client receives this kind (the renderer skips encoding unwanted passes)."""
        return any(kind in c.wants for c in list(self.clients))

    def publish(self, kind: str, payload) -> None:
        """Hand a frame to every client that wants its kind; callable from any thread. payload: bytes, or
        for "video" (header, RGB array)."""
        with self._lock:
            self._pending[kind] = payload
            self.published += kind == "rgb"
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._fan_out)
        except RuntimeError:  # loop closed: the server is shutting down
            pass

    def _fan_out(self) -> None:
        with self._lock:
            pending, self._pending, self._scheduled = self._pending, {}, False
        for kind, payload in pending.items():
            for client in self.clients:
                if kind not in client.wants:
                    continue
                if kind == "video":
                    if client.rtc is not None:
                        client.rtc.put(payload)
                else:
                    client.offer(kind, payload)

    def broadcast_status(self, make: Callable[[Client], str]) -> None:
        """Offer each client its own status text (latest wins, like frames). Loop thread only."""
        for client in self.clients:
            client.offer("status", make(client))


class Outbox:
    """One engine session's replies: every answer (a rendered frame, or a frame's one-line error), in
    order, never dropped. Loop thread only.

    Unlike a viewer's slot, nothing is replaced: an engine wants each frame it sent. The bound is
    the session's in-flight cap (ingest.EngineSession.max_inflight): frames are refused while that
    many are received and not yet answered here (`answered`), so `frames` holds at most that many
    payloads. Text replies go first, in the order given: a frame's refusal (an answer, counted) and
    pongs and other refusals (at most MAX_REPLIES of those, the oldest go first). Status is latest-wins.

    For a session that may be resumed on a new socket (the server's --resume-grace), the last
    `replay` answers written stay in `written`: an answer written into a dropped connection may never
    have arrived, and a resuming client says how many it has (`attach`). A client never has more
    than its in-flight cap of answers outstanding, so `replay` = that cap covers every gap.
    """

    def __init__(self, send_bytes: Callable[[bytes], Awaitable], send_str: Callable[[str], Awaitable],
                 replay: int = 0):
        self.send_bytes, self.send_str = send_bytes, send_str
        self.frames: deque[bytes | str] = deque()  # rendered frames (or a render's error, text) not yet written
        self.replies: deque[tuple[str, bool]] = deque()  # (text, is an answer), in order
        self.written: deque[bytes | str] = deque(maxlen=replay)  # the last answers written (for a resume)
        self.status: str | None = None
        self.answered = 0  # answers written to the socket
        self._ready = asyncio.Event()
        self.closed = False

    def frame(self, payload: bytes | str) -> None:
        self.frames.append(payload)
        self._ready.set()

    def reply(self, text: str, answer: bool = False) -> None:
        """A text reply; answer=True: a frame's refusal (it is that frame's answer, never dropped)."""
        if not answer and sum(not a for _, a in self.replies) >= MAX_REPLIES:
            del self.replies[next(i for i, (_, a) in enumerate(self.replies) if not a)]
        self.replies.append((text, answer))
        self._ready.set()

    def offer_status(self, text: str) -> None:
        self.status = text
        self._ready.set()

    def keep_written(self, replay: int) -> None:
        """Keep the last `replay` answers written (the session's in-flight cap, once its hello says it)."""
        self.written = deque(self.written, maxlen=replay)

    def attach(self, send_bytes: Callable[[bytes], Awaitable], send_str: Callable[[str], Awaitable],
               have: int) -> str | None:
        """A resumed session's new socket, whose client has received `have` answers: the answers after
        those are written again, then the rest, in the order the old socket had (or would have). Returns
        what is wrong (nothing changes) or None. Call with the old socket's pump stopped."""
        unwritten = [t for t, answer in self.replies if answer] + list(self.frames)  # the pump's order
        kept = list(self.written) + unwritten
        first = self.answered - len(self.written)  # the answer number of kept[0]
        if not first <= have <= first + len(kept):
            return (f"the client has {have} answers, but the session has {first + len(kept)} and keeps those "
                    f"from {first} on")
        self.written = deque(kept[:have - first], maxlen=self.written.maxlen)
        self.frames = deque(kept[have - first:])
        self.replies.clear()  # pongs and refusals of other messages were meant for the old socket
        self.answered = have
        self.send_bytes, self.send_str = send_bytes, send_str
        self.closed = False
        self._ready.set()
        return None

    async def pump(self) -> None:
        """Send whatever is waiting until closed: text replies first, then frames, then the status. A
        payload that fails mid-write (a dropped socket) stays queued, for a resume."""
        while not self.closed:
            if self.replies:
                text, answer = item = self.replies.popleft()
                try:
                    await self.send_str(text)
                except BaseException:
                    self.replies.appendleft(item)
                    raise
                if answer:
                    self.written.append(text)
                    self.answered += 1
            elif self.frames:
                payload = self.frames.popleft()
                try:
                    await (self.send_str(payload) if isinstance(payload, str) else self.send_bytes(payload))
                except BaseException:
                    self.frames.appendleft(payload)
                    raise
                self.written.append(payload)
                self.answered += 1
            elif self.status is not None:
                text, self.status = self.status, None
                await self.send_str(text)
            else:
                self._ready.clear()
                await self._ready.wait()

    def close(self) -> None:
        self.closed = True
        self._ready.set()
