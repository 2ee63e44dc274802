"""The page's session (session 0): source -> renderer -> JPEG frames for the clients, paced at the stream's fps.

    page = PageSession(make_renderer, LiveConfig(width=256, height=256), hub)
    page.start()                        # the render thread; returns at once
    page.command(Command("prompt", {"text": "a snowy street"}))     # any thread
    page.status()                       # fps, latency, frames, state, ...
    page.stop()                         # joins the thread, finishes a recording

One render thread owns the source, the renderer and the recorder (the world's GL context and the
model's state never cross threads). Per chunk it: 1. applies pending commands (reset, prompt, light,
source, recording) at the chunk boundary; 2. captures `renderer.chunk_frames` G-buffer frames,
stepping the playable world with the held controls; 3. renders them; 4. emits each frame at
its due time (1 / fps apart; when rendering is slower it emits as soon as ready), JPEG-encoded
once and handed to `publish(kind, payload)` (transport.Hub.publish: never blocks). So clients
cannot slow the renderer: the only waits in the loop are the pacing sleep and the renderer.

An error while rendering (the renderer, the source, the recorder) does not end the thread: the
session shows it (status "error"), finishes the recording, drops the source and the renderer, and
waits; the next start, reset, prompt, preset or source command builds them again and the stream
starts over (a new epoch), so one bad moment never needs a server restart.

latency_ms of a frame = time from capturing its G-buffers to handing out its JPEG (network excluded);
captured_ms = the capture's wall-clock time (ms since the epoch), from which a page on the same
machine measures capture -> display.
"""
from __future__ import annotations

import io
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from ...model_zoo.errors import AlayaError
from ..render.cpu import use_stream_threads
from ..world.play import Controls
from .protocol import Command
from .recorder import Recorder
from .renderers import LiveRenderer
from .sources import FileLiveSource, LiveFrame, WorldLiveSource
from .wire import pack_frame, unpack_frame  # noqa: F401 (unpack_frame: the frame format's reader, for clients)

log = logging.getLogger(__name__)

MAX_INFLIGHT = 256  # captured G-buffer frames awaiting their rendered frame; beyond: a renderer bug


class Publisher(Protocol):
    def publish(self, kind: str, payload) -> None: ...

    def wants(self, kind: str) -> bool: ...


@dataclass(frozen=True)
class LiveConfig:
    width: int = 256
    height: int = 256
    fps: float = 30.0
    seed: int = 0
    prompt: str = ""  # "" -> the first preset's prompt
    preset: str = "bright_sunny"
    source: str = "world"  # "world" | "file"
    gbuffers: Path | None = None  # the file source (looped), when given
    jpeg_quality: int = 85
    record_dir: Path = Path("recordings")
    record: bool = False  # record from the start
    record_gbuffers: bool = False
    autostart: bool = True

    def validate(self) -> "LiveConfig":
        if self.width % 16 or self.height % 16 or not 16 <= self.width <= 2048 or not 16 <= self.height <= 2048:
            raise AlayaError(f"live: size {self.width}x{self.height} must be multiples of 16 in 16..2048")
        if not 1.0 <= self.fps <= 120.0:
            raise AlayaError(f"live: fps={self.fps} is out of range 1..120")
        if not 10 <= self.jpeg_quality <= 100:
            raise AlayaError(f"live: jpeg quality {self.jpeg_quality} is out of range 10..100")
        if self.source not in ("world", "file"):
            raise AlayaError(f"live: source {self.source!r} is not one of world, file")
        if self.source == "file" and self.gbuffers is None:
            raise AlayaError("live: source 'file' needs a G-buffer path (--gbuffers)")
        from ..world.shading import PRESETS

        if self.preset not in PRESETS:
            raise AlayaError(f"live: preset {self.preset!r} is unknown; choose one of {', '.join(PRESETS)}")
        return self


def _is_text(text: str) -> bool:
    """Whether text encodes as UTF-8 (no lone surrogates): what a tokenizer and a recording take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    """uint8 (H, W, 3) -> JPEG bytes (deterministic for the same pixels and quality)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def recent_fps(times, now: float) -> float:
    """Frames/s over the last 64 of `times` (perf_counter stamps) within 10 s, measured up to now:
    steady for bursty renderers (a chunk of frames every few seconds), falling to 0 when frames stop."""
    recent = [t for t in list(times)[-64:] if now - t <= 10.0]
    return (len(recent) - 1) / (now - recent[0]) if len(recent) >= 2 and now > recent[0] else 0.0


def passes_mosaic(teacher: np.ndarray) -> np.ndarray:
    """uint8 (5, H, W, 3) -> one (H, 5W, 3) strip: albedo, depth, metallic, normal, roughness."""
    return np.concatenate(list(teacher), axis=1)


@dataclass
class _Captured:
    index: int
    time: float  # perf_counter at capture
    frame: LiveFrame
    wall: float = 0.0  # time.time() at capture: the page measures capture -> display against it


@dataclass
class _Requests:
    """Commands waiting for the next chunk boundary (written by any thread under the lock)."""

    reset: bool = False
    prompt: str | None = None
    source: str | None = None
    record: bool | None = None
    light: tuple | None = None  # (Light or None,): a light change (None inside: the prompt's light again)
    events: list = field(default_factory=list)


class PageSession:
    def __init__(self, make_renderer: Callable[[], LiveRenderer], config: LiveConfig, publisher: Publisher):
        self.config = config.validate()
        from ..world.shading import PRESETS

        self.presets = PRESETS
        self.make_renderer, self.publisher = make_renderer, publisher
        self.sources = ("world", "file") if config.gbuffers is not None else ("world",)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._requests = _Requests(record=True if config.record else None)
        self._controls = Controls()
        self._one_shot = {"jump": False, "push": False}
        # Shown in status(); written by the render thread.
        self.running = config.autostart
        self.prompt = config.prompt or PRESETS[config.preset].prompt
        self.preset = config.preset if not config.prompt else None
        self.source_name = config.source
        self.epoch = 0
        self.index = 0  # next G-buffer frame index in this epoch
        self.emitted = 0
        self.error: str | None = None  # set when rendering failed; cleared when a client restarts it
        self._restart = False  # a client asked to go on after an error
        self.recording: Path | None = None
        self.last_recording: Path | None = None
        self.player = None
        self.render_ms = 0.0
        self.light = None  # the Light the page set (sliders), or None: the prompt's (or serve --light's)
        self.ready = threading.Event()  # set once the source and renderer are up
        self._emit_times: deque[float] = deque(maxlen=256)
        self._latencies: deque[float] = deque(maxlen=64)

    # ---- any thread -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="alaya-live-render", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def command(self, cmd: Command) -> str | None:
        """Queue a validated client command; returns an error line when it cannot apply."""
        a = cmd.args
        if cmd.type == "prompt" and not _is_text(a["text"]):
            return "prompt: the text is not valid Unicode"
        with self._lock:
            if cmd.type == "control":
                if a["action"] == "start":
                    self.running = True
                elif a["action"] == "pause":
                    self.running = False
                else:
                    self._requests.reset = True
            elif cmd.type == "prompt":
                self._requests.prompt, self.preset = a["text"], None
                self._requests.events.append({"event": "prompt", "text": a["text"]})
            elif cmd.type == "preset":
                self._requests.prompt, self.preset = self.presets[a["name"]].prompt, a["name"]
                self._requests.events.append({"event": "preset", "name": a["name"]})
            elif cmd.type == "source":
                if a["name"] not in self.sources:
                    return f"source {a['name']!r} is not available (start the server with --gbuffers PATH)"
                self._requests.source = a["name"]
            elif cmd.type == "light":
                problem = getattr(self.renderer, "light_problem", None) if self.renderer is not None else None
                if problem:
                    return f"light: {problem}"
                self._requests.light = (a["light"],)
                self._requests.events.append({"event": "light", "light": a["light"] and a["light"].to_dict()})
            elif cmd.type == "record":
                self._requests.record = a["on"]
            elif cmd.type == "input":
                self._controls = Controls(move=a["move"], yaw=a["yaw"], pitch=a["pitch"], zoom=a["zoom"])
                self._one_shot["jump"] |= a["jump"]
                self._one_shot["push"] |= a["push"]
            else:
                return f"{cmd.type}: not a page command"
            if cmd.type in ("control", "prompt", "preset", "source") and a.get("action") != "pause":
                self._restart = True  # after an error: rebuild and go on (no effect otherwise)
        self._wake.set()
        return None

    def status(self) -> dict:
        fps = recent_fps(self._emit_times, time.perf_counter())
        lat = sorted(self._latencies)
        return {
            "state": "error" if self.error else ("running" if self.running else "paused"),
            "ready": self.ready.is_set(),
            "fps": round(fps, 2),
            "target_fps": self.config.fps,
            "latency_ms": round(lat[len(lat) // 2], 1) if lat else None,
            "render_ms": round(self.render_ms, 1),
            "frames": self.emitted,
            "epoch": self.epoch,
            "index": self.index,
            "prompt": self.prompt,
            "preset": self.preset,
            "light": self.light.to_dict() if self.light is not None else None,
            "light_problem": getattr(self.renderer, "light_problem", None) if self.renderer is not None else None,
            "source": self.source_name,
            "sources": list(self.sources),
            "recording": str(self.recording) if self.recording else None,
            "last_recording": str(self.last_recording) if self.last_recording else None,
            "player": self.player,
            "error": self.error,
            "size": [self.config.width, self.config.height],
        }

    # ---- render thread ----------------------------------------------------------------------

    def _open_source(self, name: str):
        c = self.config
        if name == "file":
            return FileLiveSource(c.gbuffers, c.width, c.height)
        return WorldLiveSource(c.seed, c.width, c.height, c.fps)

    def _build(self) -> None:
        """(Re)open the source and make the renderer (again after an error)."""
        self.source = self._open_source(self.source_name)
        self.renderer = self.make_renderer()
        self.renderer.set_prompt(self.prompt)
        if self.light is not None:  # the page's light outlives a rebuild after an error
            self.renderer.set_light(self.light)
        self._inflight = deque()
        self.ready.set()
        self._clock0, self._paced = time.perf_counter(), 0

    def _run(self) -> None:
        use_stream_threads()
        self.source = self.renderer = self.recorder = None
        self._inflight = deque()
        try:
            while not self._stop.is_set():
                try:
                    if self.renderer is None:
                        self._build()
                    self._apply_requests()
                    if not self.running:
                        self._wake.wait(0.1)
                        self._wake.clear()
                        self._clock0, self._paced = time.perf_counter(), 0
                        continue
                    self._render_chunk()
                except Exception as err:  # shown on the page; the server stays up
                    self._failed(err)
                    self._await_restart()
        finally:
            try:
                self._finish_recording()
            except Exception as err:
                log.error("live: the recording could not be finished: %s", err)
            self._drop_source()

    def _failed(self, err: Exception) -> None:
        """Show the error, finish the recording (what was rendered stays), drop the source and renderer."""
        message = str(err) if isinstance(err, AlayaError) else f"{type(err).__name__}: {err}"
        with self._lock:
            self.error, self._restart = message, False
        log.error("live renderer stopped: %s (Start or Reset tries again)", message,
                  exc_info=not isinstance(err, AlayaError))
        try:
            self._finish_recording()
        except Exception as rec_err:
            log.error("live: the recording could not be finished: %s", rec_err)
        self._drop_source()
        self.renderer = None  # made again on restart: its state is unknown after an error

    def _drop_source(self) -> None:
        source, self.source = self.source, None
        if source is not None:
            try:
                source.close()
            except Exception as err:
                log.warning("live: closing the source failed: %s", err)

    def _await_restart(self) -> None:
        """Wait in the error state until a client asks to go on (start, reset, prompt, preset, source)."""
        while not self._stop.is_set():
            with self._lock:
                if self._restart:  # the stream starts over, as after a reset
                    self._restart, self.error, self.running = False, None, True
                    self.epoch += 1
                    self.index, self.player = 0, None
                    self._requests.reset = False  # done: this is one
                    return
            self._wake.wait(0.1)
            self._wake.clear()

    def _apply_requests(self) -> None:
        with self._lock:
            req, self._requests = self._requests, _Requests()
        for event in req.events:
            if self.recorder:
                self.recorder.event(self.index, event)
        if req.source is not None and req.source != self.source_name:
            self.source.close()
            self.source = None
            self.source = self._open_source(req.source)
            self.source_name = req.source
            if self.recorder:
                self.recorder.event(self.index, {"event": "source", "name": req.source})
            req.reset = True
        if req.prompt is not None and req.prompt != self.prompt:
            self.renderer.set_prompt(req.prompt)
            self.prompt = req.prompt
            if getattr(self.renderer, "prompt_restarts", False):  # its stream restarted: held frames are gone
                self._inflight.clear()
        if req.light is not None:
            try:
                self.renderer.set_light(req.light[0])  # from this chunk's first frame on
                self.light = req.light[0]
            except AlayaError as err:  # refused (this renderer does not read a light): the stream goes on
                log.warning("live: the light was not applied: %s", err)
        if req.reset:
            self.source.reset()
            self.renderer.reset()
            self._inflight.clear()
            self.epoch += 1
            self.index = 0
            self.player = None
            if self.recorder:
                self.recorder.event(self.index, {"event": "reset", "epoch": self.epoch})
        if req.record is True and self.recorder is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            folder = self.config.record_dir / f"live-{stamp}"
            n = 1
            while folder.exists():
                folder, n = self.config.record_dir / f"live-{stamp}-{n}", n + 1
            self.recorder = Recorder(folder, self.config.fps, gbuffers=self.config.record_gbuffers)
            self.recording = folder
            self.recorder.event(self.index, {"event": "start", "prompt": self.prompt, "source": self.source_name,
                                             "epoch": self.epoch})
        elif req.record is False:
            self._finish_recording()

    def _finish_recording(self) -> None:
        if self.recorder is not None:
            rec, self.recorder, self.recording = self.recorder, None, None
            try:
                self.last_recording = rec.close()
            except Exception:
                rec.abort()
                raise

    def _take_controls(self) -> Controls:
        with self._lock:
            c = replace(self._controls, **self._one_shot)
            self._one_shot = {"jump": False, "push": False}
        return c

    def _render_chunk(self) -> None:
        chunk = []
        for _ in range(self.renderer.chunk_frames):
            controls = self._take_controls()
            frame = self.source.next(controls)
            self._inflight.append(_Captured(self.index, time.perf_counter(), frame, time.time()))
            if self.recorder and self.source.playable:
                self.recorder.controls(self.index, controls)
            self.index += 1
            chunk.append(frame)
        if len(self._inflight) > MAX_INFLIGHT:
            raise AlayaError(f"live: the renderer holds back {len(self._inflight)} frames (bound {MAX_INFLIGHT})")
        t0 = time.perf_counter()
        images = np.stack([f.teacher for f in chunk])
        # a file source's light passes (every frame of it has the first one's)
        rgb = self.renderer.render(images, **{name: np.stack([f.light[name] for f in chunk]) for name in chunk[0].light})
        self.render_ms = 1000 * (time.perf_counter() - t0)
        for image in rgb:
            if self._stop.is_set():
                return
            self._pace()
            self._emit(self._inflight.popleft(), image)

    def _pace(self) -> None:
        due = self._clock0 + self._paced / self.config.fps
        now = time.perf_counter()
        if now < due:
            self._stop.wait(due - now)
        elif now - due > 2.0 / self.config.fps:  # behind: emit at once and restart the schedule
            self._clock0, self._paced = now, 0
        self._paced += 1

    def _emit(self, cap: _Captured, image: np.ndarray) -> None:
        q = self.config.jpeg_quality
        image = np.asarray(image, dtype=np.uint8)
        now = time.perf_counter()
        latency = 1000 * (now - cap.time)
        header = {"kind": "rgb", "epoch": self.epoch, "index": cap.index, "latency_ms": round(latency, 1),
                  "captured_ms": round(1000 * cap.wall, 1), "player": cap.frame.player, "source": self.source_name}
        self.publisher.publish("rgb", pack_frame(header, encode_jpeg(image, q)))
        if self.publisher.wants("video"):  # WebRTC viewers: the raw frame, for their video encoders
            self.publisher.publish("video", (header, image.copy()))
        if self.publisher.wants("passes"):
            self.publisher.publish("passes", pack_frame({**header, "kind": "passes"},
                                                        encode_jpeg(passes_mosaic(cap.frame.teacher), q)))
        if self.recorder:
            self.recorder.write(image, cap.frame.teacher)
        self.player = cap.frame.player
        self.emitted += 1
        self._emit_times.append(now)
        self._latencies.append(latency)
