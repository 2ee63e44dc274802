"""Engine ingest (`/engine`, alaya_flash.client): the wire format, sessions, refusals, an external engine.

The sessions render with the real live Flash pipeline (renderer_factory: weights loaded once,
shared) on tiny random weights at 64x64, one latent frame per chunk (chunks of 1, then 4 frames),
their prompt projection scaled up so that a prompt change shows plainly in raw frames. Frames
come back raw, so "the same" means byte-equal.
"""
import asyncio
import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from alaya_flash.client import AsyncClient, Client, ClientError, engine_url
from alaya_flash.streaming.gbuffer import frame_to_teacher
from alaya_flash.streaming.live import wire
from alaya_flash.streaming.live.protocol import ProtocolError

from live_helpers import TintRenderer, listening_model_folder, start_flash_server, start_server

ROOT = Path(__file__).resolve().parents[1]
SIZE = 64


def _teacher(seed: int, n: int = 1, size: int = SIZE) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (5, size, size, 3), dtype=np.uint8) for _ in range(n)]


def _digest(image: np.ndarray) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()[:16]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return listening_model_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def flash_server(model_dir):
    server = start_flash_server(model_dir, SIZE)
    yield server
    server.stop()


def _render(url, frames, prompt=None, prompt_before=None, new_prompt=None):
    """Send frames through one session; returns the digests of the frames that came back (whole chunks)."""
    out = []
    with Client(url, prompt=prompt) as client:
        for n, g in enumerate(frames):
            if n == prompt_before:
                client.set_prompt(new_prompt)
            client.send(n, g)
        while len(out) < len(frames):
            frame = client.receive(timeout=120)
            assert frame.number == len(out) and frame.image.shape == (SIZE, SIZE, 3)
            out.append(_digest(frame.image))
    return out


# ---- the wire format -----------------------------------------------------------------------


def test_frame_message_round_trips_both_forms():
    teacher = _teacher(0)[0]
    m = wire.unpack_gbuffers(wire.pack_gbuffers(7, 12.5, teacher))
    assert (m.number, m.sent, m.width, m.height, m.form) == (7, 12.5, SIZE, SIZE, wire.FORM_UINT8)
    assert np.array_equal(m.teacher_u8(), teacher)
    rng = np.random.default_rng(1)
    passes = {"albedo": rng.random((32, 48, 3), np.float32), "depth": rng.random((32, 48), np.float32) + 0.1,
              "metallic": rng.random((32, 48), np.float32), "normal": rng.random((32, 48, 3), np.float32),
              "roughness": rng.random((32, 48), np.float32)}
    passes["depth"][0, 0] = np.inf  # background
    m = wire.unpack_gbuffers(wire.pack_gbuffers(2 ** 53 - 1, 0.0, passes, depth_near=2.0))
    assert (m.width, m.height, m.form, m.depth_near, m.number) == (48, 32, wire.FORM_FLOAT32, 2.0, 2 ** 53 - 1)
    got = m.float_passes()
    assert all(np.array_equal(got[k], v) for k, v in passes.items())
    assert len(wire.pack_gbuffers(0, 0.0, passes)) == wire.HEADER_BYTES + 36 * 32 * 48


def _header(**fields) -> bytes:
    f = {"magic": wire.MAGIC, "version": 1, "form": 1, "flags": 0, "width": SIZE, "height": SIZE, "near": 0.0,
         "number": 5, "sent": 1.0, **fields}
    return wire.HEADER.pack(f["magic"], f["version"], f["form"], f["flags"], f["width"], f["height"], f["near"],
                            f["number"], f["sent"])


BAD_FRAMES = [  # message -> what the one-line refusal says
    (b"AFG", "shorter than the 32-byte header"),
    (_header(magic=b"RIFF") + bytes(15 * SIZE * SIZE), "magic b'RIFF' is not b'AFGB'"),
    (_header(version=2) + bytes(15 * SIZE * SIZE), "version 2 is not supported"),
    (_header(number=2 ** 53), "frame number 9007199254740992 is not below 2**53"),
    (_header(form=3) + bytes(15 * SIZE * SIZE), "frame 5: form 3 is unknown"),
    (_header(flags=4) + bytes(15 * SIZE * SIZE), "frame 5: header flags (bytes 6..7) 0x0004 set unknown bits; bit 0 "
                                                 "= a shadow plane follows the passes, bit 1 = a sky plane"),
    (_header(flags=1) + bytes(15 * SIZE * SIZE), "frame 5: header flags say a shadow plane follows, but the payload "
                                                 "holds only the passes"),
    (_header(flags=2) + bytes(15 * SIZE * SIZE), "frame 5: header flags say a sky plane follows, but the payload "
                                                 "holds only the passes"),
    (_header(flags=3) + bytes(16 * SIZE * SIZE), "frame 5: header flags say a shadow plane and a sky plane follow, "
                                                 "but the payload holds the passes and 1 plane"),
    (_header() + bytes(16 * SIZE * SIZE), f"frame 5: payload of {16 * SIZE * SIZE} bytes is the passes and "
                                          f"{SIZE * SIZE} bytes more (a shadow plane or a sky plane?)"),
    (_header(flags=1) + bytes(17 * SIZE * SIZE), f"frame 5: payload of {17 * SIZE * SIZE} bytes is the passes and a "
                                                 f"shadow plane and {SIZE * SIZE} bytes more (a sky plane?)"),
    (_header(flags=1) + bytes(16 * SIZE * SIZE - 1), f"expected {16 * SIZE * SIZE} for 64x64 uint8 teacher form "
                                                     "and a 64x64 uint8 shadow plane"),
    (_header(flags=3) + bytes(17 * SIZE * SIZE + 1), f"expected {17 * SIZE * SIZE} for 64x64 uint8 teacher form "
                                                     "and a 64x64 uint8 shadow plane and a 64x64 uint8 sky plane"),
    (_header(width=60) + bytes(15 * 60 * SIZE), "frame 5: width 60 must be a multiple of 16"),
    (_header(width=4096, height=16), "frame 5: width 4096 must be a multiple of 16 in 16..2048"),
    (_header(width=2048, height=2048), "frame 5: 2048x2048 is 4194304 pixels, over the limit of 1048576"),
    (_header(sent=float("nan")) + bytes(15 * SIZE * SIZE), "frame 5: send time nan is not a finite number"),
    (_header(near=2.0) + bytes(15 * SIZE * SIZE), "frame 5: depth_near must be 0 for the uint8 form"),
    (_header(form=2, near=float("inf")) + bytes(36 * SIZE * SIZE), "frame 5: depth_near inf must be 0"),
    (_header() + bytes(15 * SIZE * SIZE - 1), f"frame 5: payload of {15 * SIZE * SIZE - 1} bytes, expected "
                                             f"{15 * SIZE * SIZE} for 64x64 uint8 teacher form"),
    (_header(form=2) + bytes(15 * SIZE * SIZE), f"expected {36 * SIZE * SIZE} for 64x64 float32 canonical passes"),
]


@pytest.mark.parametrize("message, says", BAD_FRAMES, ids=[s[:30] for _, s in BAD_FRAMES])
def test_bad_frame_headers_are_refused_with_one_line(message, says):
    with pytest.raises(ProtocolError) as err:
        wire.unpack_gbuffers(message)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert getattr(err.value, "frame", None) == (5 if str(err.value).startswith("frame 5") else None)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=64))
def test_unpack_raises_only_the_one_line_refusal_whatever_the_bytes(head, tail):
    for message in (head, wire.MAGIC + head, _header()[:8] + head + tail):
        try:
            wire.unpack_gbuffers(message)
        except ProtocolError as err:
            assert "\n" not in str(err)


def test_client_refuses_bad_frames_before_sending():
    with pytest.raises(ValueError, match=r"teacher form must be uint8 \(5, H, W, 3\)"):
        wire.pack_gbuffers(0, 0.0, np.zeros((5, 64, 64, 3), np.float32))
    passes = {"albedo": np.zeros((16, 16, 3)), "depth": np.ones((16, 16)), "metallic": np.zeros((16, 16)),
              "normal": np.zeros((16, 16, 3)), "roughness": np.zeros((16, 16))}
    with pytest.raises(ValueError, match="float passes need 'normal'"):
        wire.pack_gbuffers(0, 0.0, {k: v for k, v in passes.items() if k != "normal"})
    with pytest.raises(ValueError, match=r"metallic has shape \(8, 16\), expected \(16, 16\)"):
        wire.pack_gbuffers(0, 0.0, {**passes, "metallic": np.zeros((8, 16))})
    with pytest.raises(ValueError, match=r"frame 0: depth has 256 bad pixel\(s\), first at \(x=0, y=0\), value nan"):
        wire.pack_gbuffers(0, 0.0, {**passes, "depth": np.full((16, 16), np.nan)})
    minus = passes["depth"].copy()
    minus[3, 5] = -np.inf  # was admitted (and drawn as the nearest thing in view)
    with pytest.raises(ValueError, match=r"depth has 1 bad pixel\(s\), first at \(x=5, y=3\), value -inf: depth is a distance"):
        wire.pack_gbuffers(0, 0.0, {**passes, "depth": minus})
    with pytest.raises(ValueError, match=r"albedo has 1 bad pixel\(s\), first at \(x=0, y=0\), value \[inf, 0.0, 0.0\]"):
        wire.pack_gbuffers(0, 0.0, {**passes, "albedo": np.pad(np.full((1, 1, 3), [np.inf, 0, 0]), ((0, 15), (0, 15), (0, 0)))})
    assert wire.float_pass_problem(0, {**passes, "depth": np.full((16, 16), np.inf)}) is None  # +inf: background
    with pytest.raises(ValueError, match="width 24 must be a multiple of 16"):
        wire.pack_gbuffers(0, 0.0, np.zeros((5, 16, 24, 3), np.uint8))
    with pytest.raises(ValueError, match=r"frame number -1 must be in 0..2\*\*53-1"):
        wire.pack_gbuffers(-1, 0.0, np.zeros((5, 16, 16, 3), np.uint8))
    assert engine_url("http://127.0.0.1:8765/") == "ws://127.0.0.1:8765/engine"
    with pytest.raises(ClientError, match="is not a server address"):
        engine_url("127.0.0.1:8765")


def test_importing_the_client_does_not_import_torch():
    code = ("import sys; sys.path.insert(0, 'tests'); import conftest; import alaya_flash.client; "
            "print('torch' in sys.modules, 'alaya_flash.nodes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# ---- sessions over real sockets ------------------------------------------------------------


def test_an_engine_gets_every_frame_back_in_order_with_its_number_and_timings():
    """The tint double: each rendered frame is (albedo + the prompt's tint) // 2, so frames are exact;
    a prompt sent before a chunk's first frame renders that chunk, one sent mid-chunk the next."""
    server = start_server(autostart=False)
    try:
        frames = _teacher(3, 13)
        with Client(server.url) as client:
            assert client.hello["chunk_frames"] == 4 and client.max_inflight == 16
            for n, g in enumerate(frames[:6]):
                client.send(100 + n, g, sent=1000.0 + n)
            client.set_prompt("a snowy street")  # mid-chunk (frames 104..107): from frame 108 on
            for n, g in enumerate(frames[6:], start=6):
                client.send(100 + n, g, sent=1000.0 + n)
            got = [client.receive(timeout=30) for _ in range(11)]  # 3 chunks; the tint holds one frame back
        assert [f.number for f in got] == list(range(100, 111)) and [f.index for f in got] == list(range(11))
        assert [f.sent for f in got] == [1000.0 + n for n in range(11)]
        assert all(set(f.timings) == {"wait_ms", "turn_ms", "render_ms", "server_ms"} for f in got)
        old, new = TintRenderer(), TintRenderer()
        old.set_prompt(server._initial_prompt())
        new.set_prompt("a snowy street")
        for n, f in enumerate(got):
            tint = (old if n < 8 else new).tint
            assert np.array_equal(f.image, ((frames[n][0].astype(np.uint16) + tint) // 2).astype(np.uint8)), n
    finally:
        server.stop()


def test_float_passes_render_as_their_teacher_form():
    """The float form is converted with the project's one encoding (frame_to_teacher): the same frames
    sent as float passes and as teacher form come back equal."""
    from alaya_flash.streaming.world.play import PlayableWorld
    from alaya_flash.streaming.world.world import WorldConfig

    game = PlayableWorld(WorldConfig(seed=2, width=SIZE, height=SIZE, fps=30.0, presets=()))
    try:
        passes = [game.step() for _ in range(9)]
    finally:
        game.close()
    server = start_server(autostart=False)
    try:
        with Client(server.url) as a, Client(server.url) as b:
            for n, frame in enumerate(passes):
                a.send(n, frame, depth_near=2.0)
                b.send(n, frame_to_teacher(frame, 2.0))
            for _ in range(7):  # two chunks of four, less the frame the tint holds back
                assert np.array_equal(a.receive(timeout=30).image, b.receive(timeout=30).image)
    finally:
        server.stop()


def test_float_passes_with_a_depth_below_zero_are_refused_by_the_server():
    """A raw form-2 frame (past the client's check) with a depth of -inf gets an error naming the pixel,
    and the session goes on with the next frame."""
    server = start_server(autostart=False)
    h = w = SIZE
    passes = {"albedo": np.zeros((h, w, 3)), "depth": np.ones((h, w)), "metallic": np.zeros((h, w)),
              "normal": np.zeros((h, w, 3)), "roughness": np.zeros((h, w))}
    bad = dict(passes, depth=passes["depth"].copy())
    bad["depth"][7, 9] = -np.inf
    raw = _header(form=2, number=0) + b"".join(np.asarray(bad[n], "<f4").tobytes() for n, _ in wire.FLOAT_PASSES)

    async def main():
        async with aiohttp.ClientSession() as http, http.ws_connect(server.url + "engine") as ws:
            assert json.loads((await ws.receive(timeout=30)).data)["type"] == "hello"
            await ws.send_bytes(raw)
            while True:
                msg = await ws.receive(timeout=30)
                if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "error":
                    return json.loads(msg.data)

    try:
        error = asyncio.run(main())
    finally:
        server.stop()
    assert error["frame"] == 0
    assert "frame 0: depth has 1 bad pixel(s), first at (x=9, y=7), value -inf" in error["message"]


def test_two_sessions_share_the_weights_and_keep_their_own_state(flash_server):
    """The same input through two concurrent sessions gives exactly the frames of a session alone;
    another prompt gives other frames; the page's stream and the sessions use one loaded model."""
    frames = _teacher(5, 9)
    alone = _render(flash_server.url, frames)
    results = {}

    def run(name, prompt):
        results[name] = _render(flash_server.url, frames, prompt=prompt)

    threads = [threading.Thread(target=run, args=("a", None)), threading.Thread(target=run, args=("b", None)),
               threading.Thread(target=run, args=("rain", "heavy rain at night"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results["a"] == alone and results["b"] == alone
    assert all(x != y for x, y in zip(results["rain"], alone))

    with Client(flash_server.url) as client:
        session = flash_server.sessions[client.hello["session"]].session
        assert session.renderer.model is flash_server.page.renderer.model


def test_a_prompt_change_shows_within_one_chunk(flash_server):
    """Sent before frame 7 (mid-chunk 5..8): frames 0..8 as without it, every frame from 9 on differs."""
    frames = _teacher(6, 13)
    plain = _render(flash_server.url, frames)
    changed = _render(flash_server.url, frames, prompt_before=7, new_prompt="a foggy harbour at dawn")
    assert changed[:9] == plain[:9]
    assert all(x != y for x, y in zip(changed[9:], plain[9:]))


@pytest.mark.slow
def test_an_external_engine_process_renders_the_physics_world_through_the_client(flash_server):
    """The physics world runs in its own process and reaches the server only through the client,
    sending float passes. Frames follow its input: a run that moves from frame 9 on matches a still
    run up to frame 8 and differs after; a prompt sent before frame 11 shows from frame 13 on."""
    def engine(*extra):
        out = subprocess.run([sys.executable, str(ROOT / "tests" / "engine_process.py"), flash_server.url, "21", *extra],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.splitlines()[-1])

    still, moving = engine(), engine("--move-from", "9")
    prompted = engine("--prompt-before", "11", "a snowy mountain village")
    for run in (still, moving, prompted):
        assert run["numbers"] == list(range(21)) and not run["errors"] and not run["client_imported_torch"]
    assert moving["players"][:9] == still["players"][:9] and moving["players"][-1] != still["players"][-1]
    assert moving["digests"][:9] == still["digests"][:9]
    assert moving["digests"][12:] != still["digests"][12:] and moving["digests"][-1] != still["digests"][-1]
    assert prompted["digests"][:13] == still["digests"][:13]
    assert all(x != y for x, y in zip(prompted["digests"][13:], still["digests"][13:]))


def test_bad_input_gets_an_error_and_leaves_another_session_alone():
    """A hostile engine (bad magic, wrong version, over the size limit, truncated, another size mid-
    session, text it may not send) gets one error per message; a session beside it renders on."""
    server = start_server(autostart=False)

    async def main():
        good = await AsyncClient(server.url).connect()
        frames = _teacher(8, 9)
        async with aiohttp.ClientSession() as http, http.ws_connect(server.url + "engine") as bad:
            hello = json.loads((await bad.receive(timeout=30)).data)
            assert hello["type"] == "hello"
            await bad.send_bytes(wire.pack_gbuffers(0, 0.0, _teacher(9)[0]))  # fixes this session at 64x64
            sends = [b"RIFF" + bytes(60), _header(version=9) + bytes(10), _header(width=2048, height=2048),
                     _header()[:-1], _header() + bytes(100), wire.pack_gbuffers(1, 0.0, _teacher(9, size=32)[0])]
            for i, message in enumerate(sends):
                await bad.send_bytes(message)
                await good.send(i, frames[i])
            for text in ['{"type": "control", "action": "reset"}', '{"type": "input", "move": [0, 1]}', "nope"]:
                await bad.send_str(text)
            errors = []
            while len(errors) < len(sends) + 3:
                msg = await bad.receive(timeout=30)
                if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "error":
                    errors.append(json.loads(msg.data))
            for i in range(len(sends), len(frames)):
                await good.send(i, frames[i])
            got = [await good.receive(timeout=30) for _ in range(7)]  # two chunks, less the tint's held frame
        await good.close()
        return errors, got

    try:
        errors, got = asyncio.run(main())
    finally:
        server.stop()
    says = [e["message"] for e in errors]
    assert "magic b'RIFF' is not b'AFGB'" in says[0]
    assert "version 9 is not supported" in says[1]
    assert "over the limit of 1048576" in says[2] and errors[2]["frame"] == 5
    assert "shorter than the 32-byte header" in says[3]
    assert "payload of 100 bytes, expected 61440" in says[4]
    assert "frame 1: 32x32, but this session renders 64x64" in says[5] and errors[5]["frame"] == 1
    assert "unknown message type 'control'; known: prompt, preset, light, ping" in says[6]
    assert "unknown message type 'input'" in says[7] and "not valid JSON" in says[8]
    assert [f.number for f in got] == list(range(7))


def test_in_flight_cap_sessions_cap_and_a_failing_session():
    """Frames beyond max_inflight are refused by number (nothing queues without bound); a session
    beyond --max-sessions is refused politely; a renderer that fails ends its own session only."""
    gate = threading.Event()

    class Gated(TintRenderer):
        def render(self, chunk):
            gate.wait(60)
            if (chunk == 255).all():
                raise RuntimeError("the renderer broke")
            return super().render(chunk)

    server = start_server(renderer=Gated, autostart=False, max_sessions=3)

    async def main():
        async with aiohttp.ClientSession() as http, http.ws_connect(server.url + "engine") as raw:
            hello = json.loads((await raw.receive(timeout=30)).data)
            cap = hello["max_inflight"]
            frames = _teacher(10, 1)[0]
            for n in range(cap + 2):
                await raw.send_bytes(wire.pack_gbuffers(n, 0.0, frames))
            refusals = []
            while len(refusals) < 2:
                msg = json.loads((await raw.receive(timeout=30)).data)
                if msg["type"] == "error":
                    refusals.append(msg)
            second = await AsyncClient(server.url).connect()
            with pytest.raises(ClientError, match=r"too many sessions: 3 of 3 are in use"):
                await AsyncClient(server.url, timeout=30).connect()
            gate.set()
            got = 0
            while got < cap - 1:  # whole chunks of the cap's frames, less the one the tint holds back
                msg = await raw.receive(timeout=30)
                got += msg.type == aiohttp.WSMsgType.BINARY
            broken = np.full((5, SIZE, SIZE, 3), 255, np.uint8)
            for n in range(4):
                await second.send(n, broken)
            with pytest.raises(ClientError, match="session 2 stopped: RuntimeError: the renderer broke"):
                await second.receive(timeout=30)
            await second.close()
            for n in range(99, 103):  # the first session goes on: the held frame 15, then 99..101
                await raw.send_bytes(wire.pack_gbuffers(n, 0.0, frames))
            numbers = []
            while len(numbers) < 4:
                msg = await raw.receive(timeout=30)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    numbers.append(wire.unpack_frame(msg.data)[0]["frame"])
            assert numbers == [15, 99, 100, 101]
            return refusals, cap

    try:
        refusals, cap = asyncio.run(main())
    finally:
        gate.set()
        server.stop()
    assert [r["frame"] for r in refusals] == [cap, cap + 1]
    assert f"{cap} frames are already in flight (sent, not yet answered), the limit is {cap}" in refusals[0]["message"]


def test_status_reports_each_session_and_its_fps():
    server = start_server(autostart=False)
    try:
        with Client(server.url) as a, Client(server.url) as b:
            for n, g in enumerate(_teacher(11, 9)):
                a.send(n, g)
                b.send(n, g)
            for _ in range(7):  # two chunks, less the tint's held frame
                a.receive(timeout=30)
            status = a.status
            for _ in range(40):  # a status after these frames (four a second)
                if status.get("frames") == 7:
                    break
                threading.Event().wait(0.1)
                status = a.status
        assert status["type"] == "status" and status["session"] == a.hello["session"]
        assert status["frames"] == 7 and status["fps"] >= 0 and status["inflight"] == 2
        kinds = {s["session"]: s["kind"] for s in status["sessions"]}
        assert kinds == {0: "world", a.hello["session"]: "engine", b.hello["session"]: "engine"}
        assert all(isinstance(s["fps"], float) or s["fps"] == 0 for s in status["sessions"])
    finally:
        server.stop()


def test_the_engine_socket_keeps_the_host_and_origin_checks():
    server = start_server(autostart=False)

    async def main():
        async with aiohttp.ClientSession() as http:
            for headers in ({"Origin": "http://evil.example"}, {"Host": "evil.example:8765"}):
                with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                    await http.ws_connect(server.url + "engine", headers=headers)
                assert err.value.status == 403

    try:
        asyncio.run(main())
    finally:
        server.stop()


def test_the_client_never_waits_for_frames_that_cannot_come(flash_server):
    """The hello says the chunk schedule (the first frame alone, then 4): after 3 frames only the first
    can come back, so a second receive() is refused at once in one line instead of hanging until the
    timeout; a fourth and fifth frame complete the chunk and it comes back."""
    from alaya_flash.client import ClientError

    frames = _teacher(7, 5)
    with Client(flash_server.url) as client:
        assert (client.hello["first_chunk_frames"], client.hello["chunk_frames"], client.hello["held_frames"]) == (1, 4, 0)
        for n in range(3):
            client.send(n, frames[n])
        assert client.receive(timeout=120).number == 0
        # refused, not timed out: a wait would end in "no a rendered frame after 120 s"
        with pytest.raises(ClientError, match="no frame can come back yet: 2 sent frame"):
            client.receive(timeout=120)
        for n in range(3, 5):
            client.send(n, frames[n])
        assert [client.receive(timeout=120).number for _ in range(4)] == [1, 2, 3, 4]
