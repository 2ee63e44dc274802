"""Shared pieces of the live-page tests: a deterministic stand-in pipeline and a server fixture."""
from __future__ import annotations

import base64
import hashlib
import os
import socket

import numpy as np

from alaya_flash.streaming.live.engine import LiveConfig, LiveEngine
from alaya_flash.streaming.live.server import LiveServer


class TintPipeline:
    """A pipeline double for transport tests: albedo blended with a colour hashed from the prompt.

    Deterministic in (G-buffers, prompt), so prompt changes and resets are checkable exactly.
    Holds back one frame per chunk and returns it with the next, like a real streaming decoder.
    """

    chunk_frames = 4

    def __init__(self):
        self.tint = np.zeros(3, np.uint16)
        self.held = None

    def reset(self):
        self.held = None

    def set_prompt(self, text):
        self.tint = np.frombuffer(hashlib.sha256(text.encode()).digest()[:3], np.uint8).astype(np.uint16)

    def render(self, chunk):
        out = ((chunk[:, 0].astype(np.uint16) + self.tint) // 2).astype(np.uint8)
        if self.held is not None:
            out = np.concatenate([self.held, out])
        self.held = out[-1:]
        return out[:-1]


def start_server(pipeline=TintPipeline, **config) -> LiveServer:
    cfg = LiveConfig(**{"width": 64, "height": 64, "fps": 30.0, **config})
    server = LiveServer(lambda hub: LiveEngine(pipeline, cfg, hub), host="127.0.0.1", port=0)
    server.start_background()
    return server


def stalled_client(url: str) -> socket.socket:
    """A WebSocket client that handshakes and then never reads (the socket is kept open)."""
    host, port = url.split("//")[1].strip("/").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    if b" 101 " not in head.split(b"\r\n")[0]:
        raise RuntimeError(f"handshake refused: {head[:80]!r}")
    return s
