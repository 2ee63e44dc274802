"""WebRTC video for the live page (aiortc; optional: `pip install "alaya-flash[webrtc]"`).

    reason = webrtc.unavailable()           # None, or why this server has no WebRTC (aiortc missing)
    peer = webrtc.RtcPeer(client, loopback=True, on_state=...)
    sdp = await peer.offer()                # the server offers ...
    await peer.answer(page_sdp)             # ... the page answers (signalling over /ws, protocol.py)
    peer.put((header, image))               # loop thread, each rendered frame; latest wins
    await peer.close()

One peer connection per viewer that asks: a video track fed from the render engine's frames (the
frames the JPEG path sends, through the same kind of latest-frame slot: a peer whose encoder falls
behind skips frames, counted as dropped) and a data channel "frames" that carries, per frame
handed to the encoder, {"pts", "epoch", "index", "captured_ms", "latency_ms", "player", "source"}.
pts is the frame's capture time on a 90 kHz clock, so the RTP timestamp the page sees for the
frame is pts plus one random per-stream constant: the page learns the constant by vote
(app.js, `matchRtp`) and so knows each displayed frame's capture time.

No STUN or TURN servers (nothing outside this machine is asked). A server bound to a loopback
address offers a host candidate on 127.0.0.1 only: aioice gathers every interface's address but
loopback, and has no option for it, so its one address lister is replaced for this process
(`_loopback_only`).
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from fractions import Fraction
from typing import Callable

log = logging.getLogger(__name__)

CLOCK_HZ = 90000  # RTP video clock: pts units per second
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOOPBACK_ADDRESSES = ("127.0.0.1", "::1")
_patched = False


def unavailable() -> str | None:
    """None when WebRTC can be served; otherwise the one line the page shows."""
    if importlib.util.find_spec("aiortc") is None:
        return 'aiortc is not installed (pip install "alaya-flash[webrtc]")'
    import aioice.ice

    if not callable(getattr(aioice.ice, "get_host_addresses", None)):  # fail closed: we could not pin ICE to loopback
        return "this aioice version cannot be limited to loopback addresses"
    return None


def candidate_addresses(sdp: str) -> list[str]:
    """The connection address of every ICE candidate line ('a=candidate:F C TRANSPORT PRIORITY ADDRESS PORT
    typ ...') in an SDP; a line too short to name one yields its text, which no address equals."""
    out = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            fields = line.split()
            out.append(fields[4] if len(fields) > 5 else line)
    return out


def loopback_candidates_only(sdp: str) -> tuple[str, list[str]]:
    """The SDP without its ICE candidates that name another address than 127.0.0.1 / ::1 (mDNS names
    and unreadable lines included), and those addresses."""
    kept, dropped = [], []
    for line in sdp.split("\r\n"):
        if line.startswith("a=candidate:"):
            (address,) = candidate_addresses(line)
            if address not in LOOPBACK_ADDRESSES:
                dropped.append(address)
                continue
        kept.append(line)
    return "\r\n".join(kept), dropped


def _loopback_only() -> None:
    """Make aioice gather 127.0.0.1 only (idempotent; this process serves nothing else over ICE)."""
    global _patched
    import aioice.ice

    if not _patched:
        aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []
        _patched = True


def _track_class():
    from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
    from av import VideoFrame

    class FrameTrack(MediaStreamTrack):
        """The engine's frames as a video track: a latest-frame slot that recv() empties."""

        kind = "video"

        def __init__(self, client, on_frame: Callable[[dict, int], None]):
            super().__init__()
            self.client, self.on_frame = client, on_frame
            self.latest = None
            self.ready = asyncio.Event()
            self.t0_ms: float | None = None
            self.last_pts = -1

        def put(self, payload) -> None:
            if self.latest is not None:
                self.client.dropped += 1
            self.latest = payload
            self.ready.set()

        def stop(self) -> None:
            super().stop()
            self.ready.set()

        async def recv(self):
            while self.latest is None and self.readyState == "live":
                self.ready.clear()
                await self.ready.wait()
            if self.readyState != "live":
                raise MediaStreamError
            header, image = self.latest
            self.latest = None
            if self.t0_ms is None:
                self.t0_ms = header["captured_ms"]
            # the capture time on the RTP clock: unique per frame, so the page can match RTP timestamps
            pts = max(self.last_pts + 1, round((header["captured_ms"] - self.t0_ms) * CLOCK_HZ / 1000))
            self.last_pts = pts
            frame = VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, CLOCK_HZ)
            self.client.sent += 1
            self.on_frame(header, pts)
            return frame

    return FrameTrack


def _connect_ended(task: asyncio.Task) -> None:
    """Retrieve the outcome of aiortc's connect task: a failure is already the peer's state ("failed",
    which the page hears of), so its exception is for the debug log only."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("live: WebRTC connect ended: %s: %s", type(task.exception()).__name__, task.exception())


class RtcPeer:
    """One viewer's peer connection: states new -> offered -> answered -> connected | failed | closed."""

    def __init__(self, client, loopback: bool, on_state: Callable[["RtcPeer"], None]):
        from aiortc import RTCConfiguration, RTCPeerConnection

        if loopback:
            _loopback_only()
        self.client, self.on_state, self.state, self.loopback = client, on_state, "new", loopback
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("frames", ordered=True)
        self.track = _track_class()(client, self._send_meta)
        self.pc.addTrack(self.track)

        @self.pc.on("connectionstatechange")
        def _changed():
            if self.pc.connectionState in ("connected", "failed") and self.state not in ("closed", "failed"):
                self._set(self.pc.connectionState)

    def _set(self, state: str) -> None:
        self.state = state
        self.on_state(self)

    def _send_meta(self, header: dict, pts: int) -> None:
        if self.channel.readyState == "open":
            meta = {k: header.get(k) for k in ("epoch", "index", "captured_ms", "latency_ms", "player", "source")}
            self.channel.send(json.dumps({"pts": pts, **meta}))

    def put(self, payload) -> None:
        """(frame header, uint8 (H, W, 3) RGB) from the page session; loop thread."""
        self.track.put(payload)

    async def offer(self) -> str:
        """The offer SDP with every candidate in it (gathering is local and quick: no servers)."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self._set("offered")
        return self.pc.localDescription.sdp

    async def answer(self, sdp: str) -> None:
        from aiortc import RTCSessionDescription

        if self.loopback:  # a loopback server reaches out to no other address (serve --host allows others)
            sdp, dropped = loopback_candidates_only(sdp)
            if dropped:  # a browser lists its other interfaces: its checks to 127.0.0.1 still connect
                log.info("live: WebRTC answer: ignored ICE candidates off this machine: %s", ", ".join(dropped))
        self._set("answered")
        before = asyncio.all_tasks()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        for task in asyncio.all_tasks() - before:  # aiortc's connect task, which nothing awaits: when ICE fails
            if task.get_coro().__qualname__.endswith("__connect"):  # and we close the peer, its error was
                task.add_done_callback(_connect_ended)             # logged as a never-retrieved traceback

    async def close(self) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        self.on_state(self)  # first: the viewer is back on JPEG, and may ask again, at once
        self.track.stop()
        await self.pc.close()
