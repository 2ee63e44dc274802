"""Shared pieces of the live-page tests: a deterministic stand-in renderer and a server fixture."""
from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct

import numpy as np

from alaya_flash.streaming.live.page_session import LiveConfig, PageSession
from alaya_flash.streaming.live.server import LiveServer


class TintRenderer:
    """A renderer double for transport tests: albedo blended with a colour hashed from the prompt.

    Deterministic in (G-buffers, prompt), so prompt changes and resets are checkable exactly.
    Holds back one frame per chunk and returns it with the next, like a real streaming decoder.
    """

    chunk_frames = 4
    held_frames = 1  # returned with the next chunk (the hello says so)
    light_problem = None  # it "reads" a light: a light set live shifts the tint from the next chunk

    def __init__(self):
        self.tint = np.zeros(3, np.uint16)
        self.light_tint = np.zeros(3, np.uint16)
        self.held = None

    def reset(self):
        self.held = None

    def set_prompt(self, text):
        self.tint = _hash3(text)

    def set_light(self, light, offset=0):
        self.light_tint = np.zeros(3, np.uint16) if light is None else _hash3(repr(light.to_dict()))

    def render(self, chunk):
        tint = (self.tint + self.light_tint) % 256
        out = ((chunk[:, 0].astype(np.uint16) + tint) // 2).astype(np.uint8)
        if self.held is not None:
            out = np.concatenate([self.held, out])
        self.held = out[-1:]
        return out[:-1]


def _hash3(text: str) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(text.encode()).digest()[:3], np.uint8).astype(np.uint16)


def start_server(renderer=TintRenderer, max_sessions: int = 4, use_webrtc: bool = True, token: str | None = None,
                 resume_grace: float = 30.0, **config) -> LiveServer:
    """A server on a free 127.0.0.1 port; engine sessions (/engine) render with the same renderer factory."""
    cfg = LiveConfig(**{"width": 64, "height": 64, "fps": 30.0, **config})
    server = LiveServer(lambda hub: PageSession(renderer, cfg, hub), host="127.0.0.1", port=0,
                        make_renderer=renderer, max_sessions=max_sessions, use_webrtc=use_webrtc, token=token,
                        resume_grace=resume_grace)
    server.start_background()
    return server


def raw_client(url: str, rcvbuf: int | None = None, host_header: str | None = None) -> socket.socket:
    """A bare WebSocket client socket, handshaken (it can then send any bytes, or nothing)."""
    host, port = url.split("//")[1].strip("/").split(":")
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /ws HTTP/1.1\r\nHost: {host_header or f'{host}:{port}'}\r\nUpgrade: websocket\r\n"
              f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        byte = s.recv(1)
        if not byte:
            break
        head += byte
    if b" 101 " not in head.split(b"\r\n")[0]:
        s.close()
        raise RuntimeError(f"handshake refused: {head[:80]!r}")
    return s


def stalled_client(url: str) -> socket.socket:
    """A WebSocket client that handshakes and then never reads (the socket is kept open)."""
    return raw_client(url, rcvbuf=4096)


def ws_frame(opcode: int, payload: bytes, declared: int | None = None, fin: bool = True) -> bytes:
    """One masked client frame (RFC 6455); `declared` puts another length in the header than is sent."""
    n = len(payload) if declared is None else declared
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def read_close_code(s: socket.socket) -> int | None:
    """Read server frames until a close frame; its status code (None: the socket ended without one)."""
    buf = b""
    while True:
        while len(buf) >= 2:
            n, at = buf[1] & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, at = struct.unpack(">H", buf[2:4])[0], 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, at = struct.unpack(">Q", buf[2:10])[0], 10
            if len(buf) < at + n:
                break
            if buf[0] & 0x0F == 0x8:
                return struct.unpack(">H", buf[at:at + 2])[0] if n >= 2 else None
            buf = buf[at + n:]
        try:
            data = s.recv(65536)
        except (ConnectionError, socket.timeout):
            return None
        if not data:
            return None
        buf += data


def listening_model_folder(tmp_path_factory):
    """A random Flash model folder whose DiT listens to the prompt (random weights barely do)."""
    import torch

    from alaya_flash.model_zoo import bundle

    model = bundle.make_random_flash(seed=0)
    with torch.no_grad():
        model.dit.text_embedding[0].weight.mul_(30)
    folder = tmp_path_factory.mktemp("flash") / "m"
    bundle.save_flash(model, folder)
    return folder


def start_flash_server(model_dir, size: int):
    """A live server whose page's stream is paused (it renders nothing); engines render with the Flash weights."""
    from alaya_flash.streaming.live.renderers import renderer_factory

    make = renderer_factory(model=model_dir, chunk_latents=1, fps=30.0)
    server = start_server(renderer=make, width=size, height=size, autostart=False, max_sessions=4)
    server.page.ready.wait(120)
    return server
