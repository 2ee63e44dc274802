"""An engine's session on the live server: the G-buffer frames it sends -> its own stream -> frames back.

    session = EngineSession(1, make_renderer, prompt, emit)   # emit(kind, payload), from its thread
    session.start()                          # the render thread; emits "hello" once the renderer is up
    session.admit(message, pending)          # a checked wire.GBufferMessage, in socket order
    session.offer_prompt("a snowy street")   # in socket order with the frames
    session.offer_light(light)               # a Light (None: the prompt's), from the next frame sent on
    session.close()

Each session has its own renderer, so its own stream state (KV cache, codec memories, prompt),
made by the server's make_renderer, which shares the loaded weights between sessions
(renderers.py). Frames and prompt changes wait in one queue in the order the engine sent them;
the render thread takes `renderer.chunk_frames` frames per chunk. A prompt that arrives before a
chunk's first frame renders that chunk; one that arrives mid-chunk renders from the next. So a
prompt change shows within one chunk, at a frame the engine can tell from its own send order. A
light change is exact to the frame: the frames sent after it render under it, those before under the
light they were sent with (the renderer keys it by frame: renderers.py set_light), so an engine that
moves its sun sends its light with each frame (client.send(..., light=...)). An engine's light passes
(wire.py's light planes: its shadow map's verdict per pixel, its sky occlusion) go with their frame to the
renderer, which hands them to the shading prior in place of its screen-space shadows and ambient occlusion;
a session sends each with every frame or never (the first frame decides), and a frame that breaks that is
refused in one line.

Every admitted frame is answered exactly once, in order: its rendered frame (wire.py's frame
message, raw RGB, the frame number and send time echoed, the server's timings) or a one-line
error naming it. At most `max_inflight` frames are admitted and not yet answered (three chunks,
at least MIN_INFLIGHT): that bounds the queue, the frames held in the renderer and the outbox;
prompts with no frame between them collapse to the last, so the queue holds at most one per frame.
A renderer error ends the session (emit "failed"); the engine connects again for a new one. A
session does not know its socket: when that drops, the server keeps the session (its thread renders
on) for a client to resume (server.py, --resume-grace).

emit kinds: "hello" (text), "frame" (a frame message, bytes), "frame_error" (text), "failed" (text).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...model_zoo.errors import AlayaError
from ..render.cpu import use_stream_threads
from ..gbuffer import DEFAULT_DEPTH_NEAR, LIGHT_PASSES, GBufferFrame, frame_to_teacher
from .page_session import MAX_INFLIGHT, recent_fps
from .renderers import LiveRenderer
from .protocol import ProtocolError
from .wire import (FORM_UINT8, MAX_PIXELS, MAX_SIDE, VERSION, FrameError, GBufferMessage, float_pass_problem,
                   pack_frame)

log = logging.getLogger(__name__)

MIN_INFLIGHT = 16
"""Frames an engine may have sent and not yet had answered, at the least (more for long chunks)."""


@dataclass
class _Item:
    message: GBufferMessage
    received: float  # perf_counter when the server read it


@dataclass
class _Light:
    light: object  # a Light (model_zoo/light.py), or None: the prompt's light


class EngineSession:
    def __init__(self, session_id: int, make_renderer: Callable[[], LiveRenderer], prompt: str,
                 emit: Callable[[str, bytes | str], None]):
        self.id, self.make_renderer, self.prompt, self.emit = session_id, make_renderer, prompt, emit
        self._queue: deque[_Item | str | _Light] = deque()  # frames, prompt texts and lights, in socket order
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.size: tuple[int, int] | None = None  # (width, height), fixed by the first frame
        self.light: tuple[str, ...] | None = None  # the light planes the frames carry, fixed by the first frame
        self.accepted = 0  # frames admitted (loop thread)
        self.max_inflight = MIN_INFLIGHT
        self.ready = threading.Event()
        self.renderer: LiveRenderer | None = None  # made on the render thread
        # shown in status(); written by the render thread
        self.emitted = 0
        self.render_ms = 0.0
        self._emit_times: deque[float] = deque(maxlen=256)
        self._server_ms: deque[float] = deque(maxlen=64)

    # ---- loop thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"alaya-live-session-{self.id}", daemon=True)
        self._thread.start()

    def admit(self, message: GBufferMessage, pending: int) -> None:
        """Queue a checked frame; FrameError (naming the frame) when this session cannot take it.
        pending: frames received before this one and not yet answered (rendered frame or error written)."""
        where, size = f"frame {message.number}", (message.width, message.height)
        if self.size is not None and size != self.size:
            raise FrameError(f"{where}: {size[0]}x{size[1]}, but this session renders {self.size[0]}x{self.size[1]} "
                             f"(its first frame's size); open another session for another size", message.number)
        light = tuple(message.light)
        for name in LIGHT_PASSES if self.light is not None else ():
            if (name in light) != (name in self.light):
                said = (f"has a {name} plane, but this session's frames have none" if name in light else
                        f"has no {name} plane, but this session's frames carry one")
                raise FrameError(f"{where}: {said} (its first frame decided); a session sends the {name} plane with "
                                 f"every frame or never: open another session to change", message.number)
        if pending >= self.max_inflight:
            raise FrameError(f"{where}: {pending} frames are already in flight (sent, not yet answered), the "
                             f"limit is {self.max_inflight}; wait for rendered frames before sending more", message.number)
        self.size, self.light = size, light
        self.accepted += 1
        self._put(_Item(message, time.perf_counter()))

    def offer_prompt(self, text: str) -> None:
        self._offer(text)

    def offer_light(self, light) -> None:
        """A Light (None: the prompt's) for the frames sent after it; ProtocolError when this session's renderer
        does not read a light."""
        problem = getattr(self.renderer, "light_problem", None)
        if problem:
            raise ProtocolError(f"light: {problem}")
        self._offer(_Light(light))

    def _offer(self, change: str | _Light) -> None:
        """Queue a prompt or light change; with no frame since the last change of its kind, it replaces that
        one (so the queue holds at most one prompt and one light between two frames)."""
        with self._cond:
            i = len(self._queue) - 1
            while i >= 0 and not isinstance(self._queue[i], _Item):
                if type(self._queue[i]) is type(change):
                    self._queue[i] = change
                    break
                i -= 1
            else:
                self._queue.append(change)
            self._cond.notify()

    def _put(self, item: _Item) -> None:
        with self._cond:
            self._queue.append(item)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify()

    def join(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> dict:
        lat = sorted(self._server_ms)
        return {"session": self.id, "kind": "engine", "fps": round(recent_fps(self._emit_times, time.perf_counter()), 2),
                "frames": self.emitted, "latency_ms": round(lat[len(lat) // 2], 1) if lat else None,
                "render_ms": round(self.render_ms, 1), "size": list(self.size) if self.size else None}

    # ---- render thread ----------------------------------------------------------------------

    def _take(self) -> _Item | str | _Light | None:
        """The next frame or prompt in socket order; None once closed."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            return None if self._closed else self._queue.popleft()

    def _run(self) -> None:
        use_stream_threads()
        try:
            self.renderer = self.make_renderer()
            self.renderer.set_prompt(self.prompt)
            self.max_inflight = max(MIN_INFLIGHT, 3 * self.renderer.chunk_frames)
            self.ready.set()
            first = self.renderer.chunk_frames  # before any frame: the first chunk's size
            steady = getattr(self.renderer, "steady_chunk_frames", first)
            self.emit("hello", json.dumps({
                "type": "hello", "version": VERSION, "session": self.id, "first_chunk_frames": first,
                "chunk_frames": steady, "held_frames": getattr(self.renderer, "held_frames", 0),
                "max_inflight": self.max_inflight, "max_side": MAX_SIDE, "max_pixels": MAX_PIXELS,
                "prompt": self.prompt, "reads_light": not getattr(self.renderer, "light_problem", None)}))
            self._loop()
        except Exception as err:  # the engine hears it, the server and other sessions go on
            message = str(err) if isinstance(err, AlayaError) else f"{type(err).__name__}: {err}"
            log.error("live: engine session %d stopped: %s", self.id, message, exc_info=not isinstance(err, AlayaError))
            self.emit("failed", json.dumps({"type": "error", "message": f"session {self.id} stopped: {message}",
                                            "fatal": True}))
        finally:
            self.renderer = None

    def _loop(self) -> None:
        inflight: deque[tuple[_Item, float]] = deque()
        later: str | None = None  # a prompt that arrived mid-chunk: from the next chunk
        while True:
            if later is not None:
                self._set_prompt(later)
                later = None
            n, chunk = self.renderer.chunk_frames, []
            while len(chunk) < n:
                item = self._take()
                if item is None:
                    return
                if isinstance(item, str):
                    if chunk:
                        later = item
                    else:
                        self._set_prompt(item)
                    continue
                if isinstance(item, _Light):
                    self._set_light(item.light, len(chunk))
                    continue
                teacher = self._teacher(item)
                if teacher is not None:
                    chunk.append((item, teacher))
            start = time.perf_counter()
            images = np.stack([t for _, t in chunk])
            planes = [item.message.light_u8() for item, _ in chunk]  # the engine's light passes, the prior's
            rgb = self.renderer.render(images, **{n: np.stack([p[n] for p in planes]) for n in self.light or ()})
            turn_ms = 1000 * getattr(self.renderer, "last_wait", 0.0)  # waiting for the shared weights
            self.render_ms = 1000 * (time.perf_counter() - start) - turn_ms
            inflight.extend((item, start) for item, _ in chunk)
            if len(inflight) > MAX_INFLIGHT:
                raise AlayaError(f"the renderer holds back {len(inflight)} frames (bound {MAX_INFLIGHT})")
            for image in rgb:
                item, begun = inflight.popleft()
                self._send(item, np.asarray(image, np.uint8), begun, turn_ms)

    def _set_prompt(self, text: str) -> None:
        if text != self.prompt:
            self.renderer.set_prompt(text)
            self.prompt = text

    def _set_light(self, light, offset: int) -> None:
        """The light from the chunk's frame `offset` on; refused ones (this renderer reads none) are said, not fatal."""
        try:
            self.renderer.set_light(light, offset)
        except AlayaError as err:
            self.emit("frame_error", json.dumps({"type": "error", "message": f"light: {err}"}))

    def _teacher(self, item: _Item) -> np.ndarray | None:
        """The frame in teacher form, or None (answered with an error) when its float passes hold NaN,
        a depth below 0 or another infinite value (wire.float_pass_problem)."""
        m = item.message
        if m.form == FORM_UINT8:
            return m.teacher_u8()
        passes = m.float_passes()
        problem = float_pass_problem(m.number, passes)
        if problem:
            self.emit("frame_error", json.dumps({"type": "error", "frame": m.number, "message": problem}))
            return None
        frame = GBufferFrame(index=m.number, timestamp=0.0, **passes)
        return frame_to_teacher(frame, m.depth_near or DEFAULT_DEPTH_NEAR)

    def _send(self, item: _Item, image: np.ndarray, begun: float, turn_ms: float) -> None:
        m, now = item.message, time.perf_counter()
        server_ms = 1000 * (now - item.received)
        header = {"kind": "rgb", "session": self.id, "frame": m.number, "sent": m.sent, "index": self.emitted,
                  "format": "raw", "width": int(image.shape[1]), "height": int(image.shape[0]),
                  "timings": {"wait_ms": round(1000 * (begun - item.received), 2), "turn_ms": round(turn_ms, 2),
                              "render_ms": round(self.render_ms, 2), "server_ms": round(server_ms, 2)}}
        self.emit("frame", pack_frame(header, np.ascontiguousarray(image).tobytes()))
        self.emitted += 1
        self._emit_times.append(now)
        self._server_ms.append(server_ms)
