"""The live page's WebSocket protocol: what a client may send, checked and bounded.

Client -> server: JSON text messages, at most MAX_MESSAGE_BYTES, one object with a "type":

  {"type": "control", "action": "start" | "pause" | "reset"}
  {"type": "prompt", "text": "..."}                 style change mid-stream (1..MAX_PROMPT_CHARS)
  {"type": "preset", "name": "sunset_dramatic"}     a lighting preset: its prompt (and look)
  {"type": "light", "light": {...} | "..." | null}  the light from the next frame on: a JSON Light (any of
                                                    its fields, model_zoo/light.py), its short form
                                                    ("sunset_dramatic,az=90,el=20"), or null: the prompt's
  {"type": "source", "name": "world" | "file"}      switch source (file: only when the server has one)
  {"type": "input", "move": [right, forward], "yaw": deg, "pitch": deg, "zoom": rel,
   "jump": bool, "push": bool}                      held keys; applied every physics tick until the
                                                    next input message (jump / push fire once)
  {"type": "record", "on": true | false}            start / stop recording (when the server allows it)
  {"type": "passes", "on": true | false}            this client also wants the G-buffer passes
  {"type": "ping", "t": number}                     answered with {"type": "pong", "t": same}
  {"type": "webrtc", "on": true | false}            ask for WebRTC video (answered with {"type": "offer",
                                                    "sdp"}), or close it and return to JPEG frames
  {"type": "answer", "sdp": "v=0..."}               the page's SDP answer to that offer (webrtc.py);
                                                    the one message allowed up to MAX_SDP_MESSAGE_BYTES

Anything else (binary, not JSON, not an object, nested deeper than MAX_DEPTH, text that is not
valid Unicode (a lone surrogate such as "\\ud800" in JSON), unknown type, unknown or missing
field, wrong kind, out of range) is refused with one {"type": "error", "message": ...} reply and
no other effect; messages beyond the rate limit likewise. `parse_message` raises ProtocolError
with that one-line message, and nothing else whatever the input (tests/test_live_protocol.py).

Server -> client: JSON text messages {"type": "hello" | "status" | "error" | "pong", ...} and binary
frame messages: 4-byte big-endian header length, a JSON header {"kind": "rgb" | "passes", "epoch",
"index", "latency_ms", ...}, then the JPEG bytes. docs/live.md has the full description.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 4096
"""Largest client message we parse; larger ones are refused (the socket's hard cap is WS_MAX_BYTES)."""
WS_MAX_BYTES = 65536
"""aiohttp's receive limit: a client sending more is disconnected (close code 1009)."""
MAX_DEPTH = 5
"""Deepest nesting of arrays/objects a message may have (the protocol's own messages nest at most 5 deep:
a light's fill colour, message -> light -> fills -> fill -> [r, g, b]); checked before parsing, so no
message can exhaust the parser's stack."""
MAX_PROMPT_CHARS = 1000
MAX_SDP_MESSAGE_BYTES = 16384
"""An SDP answer's message limit: a browser's answer with every ICE candidate of a machine with
many interfaces can pass 4 KiB (one host candidate line is ~100 bytes)."""
RATE_PER_SECOND = 60.0  # sustained messages per second per client (key repeat is ~30/s)
RATE_BURST = 120
MAX_STRIKES = 50
"""Refused messages in a row after which the server closes the client (1008 policy violation)."""

ACTIONS = ("start", "pause", "reset")
SOURCES = ("world", "file")
LIMITS = {"yaw": 10.0, "pitch": 10.0, "zoom": 0.5}  # per physics tick, as play.Controls allows


class ProtocolError(ValueError):
    """A refused client message; str() is the one line sent back to the client."""


@dataclass(frozen=True)
class Command:
    """One validated client message: type plus its checked fields."""

    type: str
    args: dict = field(default_factory=dict)


def _bool(msg: dict, key: str) -> bool:
    v = msg.get(key, False)
    if not isinstance(v, bool):
        raise ProtocolError(f"{msg['type']}: {key!r} must be true or false, got {v!r:.40}")
    return v


def _number(msg: dict, key: str, lo: float, hi: float, default: float = 0.0) -> float:
    v = msg.get(key, default)
    # range first: an int of thousands of digits compares fine but cannot become a float
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or not math.isfinite(v):
        raise ProtocolError(f"{msg['type']}: {key!r} must be a number in [{lo:g}, {hi:g}], got {v!r:.40}")
    return float(v)


def _string(msg: dict, key: str, max_chars: int) -> str:
    v = msg.get(key)
    if not isinstance(v, str) or not v.strip() or len(v) > max_chars:
        raise ProtocolError(f"{msg['type']}: {key!r} must be a non-empty string of at most {max_chars} characters")
    return v.strip()


def _sdp(msg: dict) -> str:
    """An SDP answer's text: printable ASCII lines, starting with the version line; aiortc parses the rest."""
    v = msg.get("sdp")
    if not isinstance(v, str) or not v.startswith("v=0\r\n"):
        raise ProtocolError(f"{msg['type']}: 'sdp' must be SDP text starting with 'v=0' and CRLF, got {v!r:.40}")
    bad = next((i for i, ch in enumerate(v) if not (" " <= ch <= "~" or ch in "\r\n")), None)
    if bad is not None:
        raise ProtocolError(f"{msg['type']}: 'sdp' character {bad + 1} ({v[bad]!r}) is not printable ASCII")
    return v


def _choice(msg: dict, key: str, choices) -> str:
    v = msg.get(key)
    if v not in choices:
        raise ProtocolError(f"{msg['type']}: {key!r} must be one of {', '.join(choices)}, got {v!r:.40}")
    return v


# type -> (allowed keys besides "type", parser of the remaining fields)
_SCHEMA = {
    "control": ({"action"}, lambda m, ctx: {"action": _choice(m, "action", ACTIONS)}),
    "prompt": ({"text"}, lambda m, ctx: {"text": _string(m, "text", MAX_PROMPT_CHARS)}),
    "preset": ({"name"}, lambda m, ctx: {"name": _choice(m, "name", ctx.get("presets", ()))}),
    "source": ({"name"}, lambda m, ctx: {"name": _choice(m, "name", ctx.get("sources", SOURCES))}),
    "record": ({"on"}, lambda m, ctx: {"on": _bool(m, "on")}),
    "passes": ({"on"}, lambda m, ctx: {"on": _bool(m, "on")}),
    "ping": ({"t"}, lambda m, ctx: {"t": _number(m, "t", -1e15, 1e15)}),
    "webrtc": ({"on"}, lambda m, ctx: {"on": _bool(m, "on")}),
    "answer": ({"sdp"}, lambda m, ctx: {"sdp": _sdp(m)}),
    "input": ({"move", "yaw", "pitch", "zoom", "jump", "push"}, lambda m, ctx: _input(m)),
    "light": ({"light"}, lambda m, ctx: {"light": _light(m)}),
}
TYPES = tuple(_SCHEMA)
ENGINE_TYPES = ("prompt", "preset", "light", "ping")
"""What an engine session (`/engine`) takes as text; its G-buffer frames are binary (wire.py)."""


def _input(msg: dict) -> dict:
    move = msg.get("move", [0, 0])
    if not isinstance(move, list) or len(move) != 2:
        raise ProtocolError("input: 'move' must be [right, forward], two numbers in [-1, 1]")
    pair = {"type": "input", "right": move[0], "forward": move[1]}
    out = {"move": (_number(pair, "right", -1, 1), _number(pair, "forward", -1, 1))}
    for key, lim in LIMITS.items():
        out[key] = _number(msg, key, -lim, lim)
    out["jump"], out["push"] = _bool(msg, "jump"), _bool(msg, "push")
    return out


def _light(msg: dict):
    """A checked Light (model_zoo/light.py), or None for the prompt's light. Imported here, on the server:
    the engine's client imports this module without torch."""
    if "light" not in msg:
        raise ProtocolError("light: 'light' is missing: a JSON light object, its short form (az=90,el=30, a preset "
                            "name first) or null for the prompt's light")
    value = msg["light"]
    if value is None:
        return None
    from ...model_zoo.errors import AlayaError
    from ...model_zoo.light import Light
    from ..render.lighting import named

    try:
        if isinstance(value, dict):
            return Light.from_dict(value, "light")
        if isinstance(value, str) and len(value) <= MAX_PROMPT_CHARS and not value.lstrip().startswith("{"):
            return Light.parse(value, "light", named=named())
    except AlayaError as err:
        raise ProtocolError(" ".join(str(err).split())[:300]) from None
    except (ArithmeticError, ValueError, TypeError) as err:  # e.g. an integer too large to become a float
        raise ProtocolError(f"light: not a light ({type(err).__name__}: {str(err)[:80]})") from None
    raise ProtocolError(f"light: 'light' must be a JSON light object, its short form (at most {MAX_PROMPT_CHARS} "
                        f"characters) or null, got {value!r:.40}")


def _depth(raw: str) -> int:
    """Deepest nesting of [ and { outside JSON strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _check_text(value, where: str = "message") -> None:
    """Refuse strings (keys and values, at any depth) that are not valid Unicode: lone surrogates,
    which JSON's \\uD800 escapes can produce and which no UTF-8 encoder (tokenizer, file, socket) takes."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ProtocolError(f"{where}: character {err.start + 1} ({value[err.start]!r}) is not valid Unicode "
                                f"text (a lone surrogate); send UTF-8 text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, where)
            _check_text(v, f"field {k!r:.40}" if k.isascii() else where)
    elif isinstance(value, list):
        for v in value:
            _check_text(v, where)


def parse_message(raw, context: dict | None = None) -> Command:
    """Check one client message (str or bytes); returns a Command or raises ProtocolError (nothing else).

    context: {"presets": names, "sources": names} the server currently offers; "types": the message
    types this socket takes (default: all of TYPES).
    """
    if not isinstance(raw, str):
        raise ProtocolError("binary messages are not accepted; send JSON text")
    size = len(raw.encode("utf-8", "surrogatepass"))
    # only an SDP answer (its type first, as the page sends it) may be longer; its type is checked once parsed
    answer = raw.startswith(('{"type":"answer"', '{"type": "answer"'))
    limit = MAX_SDP_MESSAGE_BYTES if answer else MAX_MESSAGE_BYTES
    if size > limit:
        raise ProtocolError(f"message of {size} bytes is over the limit of {limit} bytes")
    depth = _depth(raw)
    if depth > MAX_DEPTH:
        raise ProtocolError(f"message nests {depth} levels deep; the limit is {MAX_DEPTH} levels")
    try:
        msg = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ProtocolError(f"message is not valid JSON ({err.msg} at column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer over Python's digit limit
        raise ProtocolError(f"message is not valid JSON ({str(err)[:80]})") from None
    _check_text(msg)
    if not isinstance(msg, dict):
        raise ProtocolError(f"message must be a JSON object, got {type(msg).__name__}")
    kind = msg.get("type")
    types = (context or {}).get("types", TYPES)  # an engine session takes fewer (ENGINE_TYPES)
    if kind not in _SCHEMA or kind not in types:
        raise ProtocolError(f"unknown message type {kind!r:.40}; known: {', '.join(types)}")
    if size > MAX_MESSAGE_BYTES and kind != "answer":  # '{"type":"answer", ..., "type":"prompt"}'
        raise ProtocolError(f"message of {size} bytes is over the limit of {MAX_MESSAGE_BYTES} bytes")
    allowed, parse = _SCHEMA[kind]
    extra = sorted(set(msg) - allowed - {"type"})
    if extra:
        raise ProtocolError(f"{kind}: unknown field {extra[0]!r:.40}; allowed: {', '.join(sorted(allowed))}")
    return Command(kind, parse(msg, context or {}))


class RateLimiter:
    """Token bucket: `rate` messages per second sustained, `burst` at once. allow() spends one token."""

    def __init__(self, rate: float = RATE_PER_SECOND, burst: int = RATE_BURST, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.stamp = float(burst), clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
