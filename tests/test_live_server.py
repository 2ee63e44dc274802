"""The live server over real sockets: frames, commands, bad input, 404s, slow clients, recording."""
import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files.sinks import OUTPUT_MARK
from alaya_flash.streaming.live.page_session import unpack_frame
from alaya_flash.streaming.live.protocol import MAX_STRIKES, WS_MAX_BYTES, Command

from live_helpers import TintRenderer, raw_client, read_close_code, stalled_client, start_server, ws_frame
from process_helpers import store_prompts, wait_until

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
       "from alaya_flash.streaming.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def server():
    s = start_server()
    yield s
    s.stop()


async def _frames(ws, n, kind="rgb", timeout=30.0, epoch=None):
    """Collect n frame headers (and JPEGs) of one kind, answering nothing; text messages returned too."""
    got, texts = [], []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        msg = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
        if msg.type == aiohttp.WSMsgType.BINARY:
            header, jpeg = unpack_frame(msg.data)
            if header["kind"] == kind and (epoch is None or header["epoch"] == epoch):
                got.append((header, jpeg))
        elif msg.type == aiohttp.WSMsgType.TEXT:
            texts.append(json.loads(msg.data))
        else:
            raise AssertionError(f"socket closed: {msg}")
    return got, texts


async def _until_text(ws, pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        msg = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
        if msg.type == aiohttp.WSMsgType.TEXT:
            data = json.loads(msg.data)
            if pred(data):
                return data
        elif msg.type != aiohttp.WSMsgType.BINARY:
            raise AssertionError(f"socket closed: {msg}")


def _run(coro, timeout: float = 180.0):
    """Run a test's client; a hang past `timeout` is a failure, not a stalled suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_page_and_static_files_and_404s(server):
    async def main():
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url) as r:
                assert r.status == 200 and "alaya-flash" in await r.text()
                assert "default-src 'self'" in r.headers["Content-Security-Policy"]
            async with s.get(server.url + "static/app.js") as r:
                assert r.status == 200 and r.content_type == "text/javascript"
            for path in ["static/../server.py", "static/..%2Fserver.py", "static/%2e%2e%2fengine.py",
                         "static/__init__.py", "../../etc/passwd", "static/", "etc/passwd", "static/app.js/x",
                         "server.py", "static/.%2e/.%2e/pyproject.toml"]:
                async with s.get(server.url + path) as r:
                    assert r.status == 404, path

    _run(main())


def test_frames_arrive_change_and_follow_the_prompt(server):
    async def main():
        async with aiohttp.ClientSession() as s, s.ws_connect(server.url + "ws") as ws:
            hello = await _until_text(ws, lambda m: m["type"] == "hello")
            assert "bright_sunny" in hello["presets"] and hello["sources"] == ["world"]
            await ws.send_json({"type": "prompt", "text": "prompt A"})
            await ws.send_json({"type": "control", "action": "reset"})
            status = await _until_text(ws, lambda m: m["type"] == "status" and m["prompt"] == "prompt A"
                                       and m["epoch"] > hello["status"]["epoch"])
            a, _ = await _frames(ws, 8, epoch=status["epoch"])
            assert len({jpeg for _, jpeg in a}) > 1  # the world moves: frames change
            assert [h["index"] for h, _ in a] == sorted(h["index"] for h, _ in a)
            # the same prompt after a reset gives the same frames (same seed, same world) ...
            await ws.send_json({"type": "control", "action": "reset"})
            s2 = await _until_text(ws, lambda m: m["type"] == "status" and m["epoch"] > status["epoch"])
            a2, _ = await _frames(ws, 8, epoch=s2["epoch"])
            by_index = {h["index"]: j for h, j in a}
            common = [(by_index[h["index"]], j) for h, j in a2 if h["index"] in by_index]
            assert common and all(x == y for x, y in common)
            # ... and another prompt gives other frames at the same indices
            await ws.send_json({"type": "prompt", "text": "prompt B"})
            await ws.send_json({"type": "control", "action": "reset"})
            s3 = await _until_text(ws, lambda m: m["type"] == "status" and m["epoch"] > s2["epoch"]
                                   and m["prompt"] == "prompt B")
            b, _ = await _frames(ws, 8, epoch=s3["epoch"])
            common = [(by_index[h["index"]], j) for h, j in b if h["index"] in by_index]
            assert common and all(x != y for x, y in common)
            st = await _until_text(ws, lambda m: m["type"] == "status" and m["fps"] > 0)
            assert st["latency_ms"] is not None and st["latency_ms"] >= 0

    _run(main())


def test_keys_move_the_player_and_passes_on_request(server):
    async def main():
        async with aiohttp.ClientSession() as s, s.ws_connect(server.url + "ws") as ws:
            hello = await _until_text(ws, lambda m: m["type"] == "hello")
            await ws.send_json({"type": "passes", "on": True})
            await ws.send_json({"type": "control", "action": "reset"})
            st = await _until_text(ws, lambda m: m["type"] == "status" and m["epoch"] > hello["status"]["epoch"])
            start, _ = await _frames(ws, 1, kind="passes", epoch=st["epoch"])
            y0 = start[0][0]["player"][1]
            await ws.send_json({"type": "input", "move": [0, 1]})  # W: forward, away from the camera
            later, _ = await _frames(ws, 30, kind="passes", epoch=st["epoch"])
            await ws.send_json({"type": "input"})  # keys released
            header, jpeg = later[-1]
            assert header["player"][1] > y0 + 0.05  # the default camera looks along +y
            assert jpeg != start[0][1]
            from PIL import Image
            import io
            assert Image.open(io.BytesIO(jpeg)).size == (5 * 64, 64)  # five passes side by side

    _run(main())


def test_bad_input_is_refused_without_harm(server):
    async def main():
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(server.url + "ws") as ws:
                for bad in ['{"type": "shutdown"}', "{{{", '{"type": "control", "action": "rm -rf"}',
                            '{"type": "source", "name": "file"}', '{"type": "prompt", "text": "' + "z" * 5000 + '"}']:
                    await ws.send_str(bad)
                    err = await _until_text(ws, lambda m: m["type"] == "error")
                    assert err["message"]
                await ws.send_bytes(b"\x00" * 100)
                assert "binary" in (await _until_text(ws, lambda m: m["type"] == "error"))["message"]
                # still served after all that
                got, _ = await _frames(ws, 2)
                assert got
            # a message over the socket's hard cap closes that client only
            async with s.ws_connect(server.url + "ws") as ws:
                await ws.send_str("x" * (WS_MAX_BYTES + 10))
                while True:
                    msg = await ws.receive(timeout=10)
                    if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                        break
                assert ws.close_code == 1009
            # a flood trips the rate limit, then too many refusals close the client
            async with s.ws_connect(server.url + "ws") as ws:
                for _ in range(MAX_STRIKES + 150):
                    try:  # a server that has closed this client reads no more: the send would wait forever
                        await asyncio.wait_for(ws.send_str('{"type": "ping", "t": 1}'), 10)
                    except (asyncio.TimeoutError, ConnectionResetError):
                        break
                errors = []
                while True:
                    msg = await ws.receive(timeout=10)
                    if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "error":
                        errors.append(json.loads(msg.data)["message"])
                    elif msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                        break
                assert any("rate limit" in e for e in errors) and ws.close_code == 1008
            # a cross-site page may not drive the server
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                await s.ws_connect(server.url + "ws", headers={"Origin": "http://evil.example"})
            assert err.value.status == 403
            # and the renderer kept going for everybody else
            async with s.ws_connect(server.url + "ws") as ws:
                got, _ = await _frames(ws, 3)
                assert len(got) == 3
        assert server.page.error is None

    _run(main())


def test_a_client_that_reads_nothing_does_not_slow_the_others():
    server = start_server(width=256, height=256, jpeg_quality=100)  # big frames: the stall comes fast
    try:
        async def main():
            async with aiohttp.ClientSession() as s:
                stalled = stalled_client(server.url)  # handshakes, then never reads
                async with s.ws_connect(server.url + "ws") as ws:
                    got, _ = await _frames(ws, 40)
                    st = await _until_text(ws, lambda m: m["type"] == "status")
                    assert st["viewers"] == 2
                    slow = [c for c in server.hub.clients if c.dropped > 0 and c.sent < 40]
                    return got, slow, stalled

        got, slow, stalled = _run(main())
        t = [h["index"] for h, _ in got]
        assert len(got) == 40 and t == sorted(t)
        # the stalled viewer had frames skipped for it and holds at most one of each kind
        assert slow and all(c.pending() <= 2 for c in slow)
        stalled.close()
    finally:
        server.stop()


def test_record_writes_rgb_gbuffers_and_controls(tmp_path):
    from alaya_flash.streaming.files.readers import open_gbuffers

    server = start_server(record_dir=tmp_path / "rec", record_gbuffers=True)
    try:
        async def main():
            async with aiohttp.ClientSession() as s, s.ws_connect(server.url + "ws") as ws:
                await ws.send_json({"type": "record", "on": True})
                st = await _until_text(ws, lambda m: m["type"] == "status" and m["recording"])
                await ws.send_json({"type": "input", "move": [1, 0], "jump": True})
                await _frames(ws, 12)
                await ws.send_json({"type": "prompt", "text": "recorded prompt"})
                await _frames(ws, 6)
                await ws.send_json({"type": "record", "on": False})
                done = await _until_text(ws, lambda m: m["type"] == "status" and m["last_recording"])
                return st["recording"], done["last_recording"]

        rec, done = _run(main())
    finally:
        server.stop()
    assert rec == done
    folder = tmp_path / "rec" / done.split("/")[-1]
    assert sorted(p.name for p in folder.iterdir()) == [OUTPUT_MARK, "controls.jsonl", "gbuffers"]
    stream = open_gbuffers(folder / "gbuffers")
    frames = list(stream.teacher_frames(extras=True))
    assert len(frames) >= 18 and all(ext["rgb"].shape == (64, 64, 3) for _, ext in frames)
    rows = [json.loads(line) for line in (folder / "controls.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "prompt" and r["text"] == "recorded prompt" for r in rows)
    ticks = [r for r in rows if "move" in r]
    assert any(r["move"] == [1.0, 0.0] for r in ticks) and sum(r["jump"] for r in ticks) == 1
    assert not list((tmp_path / "rec").glob("*.tmp"))


def test_file_source_loops_and_serve_cli_refuses_bad_options(tmp_path, capsys):
    from alaya_flash.streaming.cli import main
    from alaya_flash.streaming.files.sinks import NpyWindowSink

    clip = tmp_path / "clip"
    with NpyWindowSink(clip, window=3) as sink:
        for i in range(5):
            sink.write(gbuffer=np.full((5, 32, 32, 3), 40 * i, np.uint8))
    server = start_server(source="file", gbuffers=clip, width=32, height=32)
    try:
        async def main_():
            async with aiohttp.ClientSession() as s, s.ws_connect(server.url + "ws") as ws:
                hello = await _until_text(ws, lambda m: m["type"] == "hello")
                assert hello["sources"] == ["world", "file"] and hello["status"]["source"] == "file"
                await ws.send_json({"type": "input", "move": [1, 1]})  # ignored by a file source
                got, _ = await _frames(ws, 14)
                return got

        got = _run(main_())
    finally:
        server.stop()
    by_index = {h["index"]: j for h, j in got}
    assert all(h["player"] is None for h, _ in got)
    loops = [(i, i + 5) for i in by_index if i + 5 in by_index]
    assert loops and all(by_index[i] == by_index[k] for i, k in loops)  # 5 frames, looped
    assert len(set(by_index.values())) == 5
    for argv, words in [(["serve", "--size", "50", "--random-model"], "multiples of 16"),
                        (["serve", "--source", "file", "--random-model"], "--gbuffers"),
                        (["serve", "--gbuffers", str(tmp_path / "none"), "--random-model"], "no such file"),
                        (["serve", "--model", str(tmp_path / "none")], "no such model folder"),
                        (["serve", "--workflow", "workflows/api/live-preview.json", "--no-refiner"],
                         "take its Refine node out")]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1


# ---- hardening (issue #34): what a hostile page or a broken client can try ------------------------


def test_host_header_must_name_this_server(server):
    from alaya_flash.streaming.live.server import host_name

    assert [host_name(h) for h in ["LocalHost:8765", "[::1]:80", "[::1]", "127.0.0.1", "evil.example:1",
                                   "a:b", "[::1]x", "[::1", ""]] == \
        ["localhost", "::1", "::1", "127.0.0.1", "evil.example", "", "", "", ""]
    port = server.url.rstrip("/").rsplit(":", 1)[1]

    async def main():
        async with aiohttp.ClientSession() as s:
            # DNS rebinding: evil.example re-pointed at 127.0.0.1; the page's Origin matches its Host
            for host in [f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}",
                         f"127.0.0.1.nip.io:{port}", f"localhost:{port}@evil.example", ""]:
                for path in ["", "static/app.js", "nothing"]:
                    async with s.get(server.url + path, headers={"Host": host, "Origin": f"http://{host}"}) as r:
                        assert r.status == 403, (host, path)
                        body = await r.text()
                        assert "Host" in body and len(body) < 120 and "alaya-flash" not in body
                with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                    await s.ws_connect(server.url + "ws", headers={"Host": host, "Origin": f"http://{host}"})
                assert err.value.status == 403
            for host in [f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST", f"127.0.0.2:{port}"]:
                async with s.get(server.url, headers={"Host": host}) as r:
                    assert r.status == 200, host
                async with s.ws_connect(server.url + "ws", headers={"Host": host, "Origin": f"http://{host}"}) as ws:
                    assert (await _until_text(ws, lambda m: m["type"] == "hello"))["status"]

    _run(main())
    with pytest.raises(RuntimeError, match="403"):  # the raw upgrade too
        raw_client(server.url, host_header=f"evil.example:{port}")


def test_a_misbehaving_viewer_does_not_disturb_another(server):
    """Viewer A tries every bad message (and broken sockets) while viewer B keeps receiving frames."""
    hostile = [
        ('{"type": "prompt", "text": "\\ud800"}', "not valid Unicode"),
        ('{"type": "preset", "name": "\\udfff"}', "not valid Unicode"),
        ("[" * 4000, "nests 4000 levels deep; the limit is"),
        ('{"type": "prompt", "text": ' + "[" * 1000 + "]" * 1000 + "}", "the limit is"),
        ('{"type": "ping", "t": ' + "9" * 4000 + "}", "must be a number"),
        ('{"type": "prompt", "text": "' + "z" * 5000 + '"}', "over the limit of 4096 bytes"),
    ]

    async def main():
        async with aiohttp.ClientSession() as s, s.ws_connect(server.url + "ws") as b:
            first, _ = await _frames(b, 2)
            watch = asyncio.ensure_future(_frames(b, 30, timeout=60))
            async with s.ws_connect(server.url + "ws") as a:
                for raw, words in hostile:
                    await a.send_str(raw)
                    err = await _until_text(a, lambda m: m["type"] == "error")
                    assert words in err["message"], (raw[:40], err)
                await a.send_bytes(b"\x00" * 1000)
                assert "binary" in (await _until_text(a, lambda m: m["type"] == "error"))["message"]
                st = await _until_text(a, lambda m: m["type"] == "status")
                assert st["state"] == "running" and st["error"] is None
            # an oversized binary frame closes that socket (1009) at its header, before the payload
            async with s.ws_connect(server.url + "ws") as a:
                await a.send_bytes(b"\x01" * (WS_MAX_BYTES + 1))
                while (await a.receive(timeout=10)).type not in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                                                  aiohttp.WSMsgType.CLOSING):
                    pass
                assert a.close_code == 1009
            loop = asyncio.get_running_loop()

            def raw_abuse():
                codes = []
                for frame in [ws_frame(0x2, b"", declared=1 << 40), ws_frame(0x1, b"", declared=1 << 62),
                              ws_frame(0x1, b'{"ty', fin=False) + ws_frame(0x0, b"x" * (WS_MAX_BYTES + 10), fin=False),
                              ws_frame(0x1, b"\xff\xfe{}")]:
                    sock = raw_client(server.url)
                    sock.sendall(frame)
                    codes.append(read_close_code(sock))
                    sock.close()
                for frame in [ws_frame(0x1, b'{"type": "prom', declared=1000),  # aborted mid-message
                              ws_frame(0x1, b'{"type": ', fin=False)]:         # aborted between fragments
                    sock = raw_client(server.url)
                    sock.sendall(frame)
                    time.sleep(0.2)
                    sock.close()
                return codes

            codes = await loop.run_in_executor(None, raw_abuse)
            assert codes == [1009, 1009, 1009, 1007]
            got, _ = await watch
            # B got frames all along, in order, in the same epoch (nothing reset the stream)
            assert len(got) == 30 and len({h["epoch"] for h, _ in got}) == 1
            assert [h["index"] for h, _ in got] == sorted(h["index"] for h, _ in got)
            await asyncio.sleep(0.5)
            st = await _until_text(b, lambda m: m["type"] == "status")
            assert st["viewers"] == 1 and st["state"] == "running" and st["error"] is None

    _run(main())
    assert server.page.error is None and len(server.hub.clients) == 0
    # the engine refuses such text itself too, whoever calls it
    assert "not valid Unicode" in server.page.command(Command("prompt", {"text": "a\ud800"}))


class FragileRenderer(TintRenderer):
    """Fails on the prompt "boom" (like a tokenizer refusing text), and its first build fails."""

    builds = 0

    def __init__(self):
        type(self).builds += 1
        if type(self).builds == 1:
            raise RuntimeError("the model could not be loaded (first try)")
        super().__init__()

    def set_prompt(self, text):
        if text == "boom":
            raise AlayaError("prompt: the tokenizer refused it")
        super().set_prompt(text)


@pytest.mark.slow
def test_a_renderer_error_recovers_on_start_reset_or_preset(tmp_path):
    server = start_server(renderer=FragileRenderer, record=True, record_dir=tmp_path / "rec")
    try:
        async def main():
            async with aiohttp.ClientSession() as s, s.ws_connect(server.url + "ws") as a, \
                    s.ws_connect(server.url + "ws") as b:
                # the first build failed: every viewer sees the error
                for ws in (a, b):
                    st = await _until_text(ws, lambda m: m["type"] == "status" and m["state"] == "error")
                    assert "could not be loaded" in st["error"]
                epoch = st["epoch"]
                for recover in [{"type": "control", "action": "start"}, {"type": "control", "action": "reset"},
                                {"type": "preset", "name": "overcast"}]:
                    await a.send_json(recover)
                    got, _ = await _frames(b, 4, epoch=epoch + 1)
                    index = [h["index"] for h, _ in got]  # the stream started over (a slow viewer may skip frames)
                    assert index == sorted(index) and index[0] < 4
                    for ws in (a, b):
                        st = await _until_text(ws, lambda m: m["type"] == "status" and m["epoch"] == epoch + 1)
                        assert st["state"] == "running" and st["error"] is None
                    # a prompt the renderer cannot take breaks it again; pause does not recover it
                    await a.send_json({"type": "prompt", "text": "boom"})
                    st = await _until_text(b, lambda m: m["type"] == "status" and m["state"] == "error")
                    assert "tokenizer refused" in st["error"] and st["prompt"] != "boom"
                    await a.send_json({"type": "control", "action": "pause"})
                    await asyncio.sleep(0.5)
                    assert (await _until_text(b, lambda m: m["type"] == "status"))["state"] == "error"
                    epoch = st["epoch"]
                st = await _until_text(a, lambda m: m["type"] == "status")
                return st

        _run(main())
    finally:
        server.stop()
    # each run between errors was recorded and finished; nothing temporary is left
    folders = sorted(p.name for p in (tmp_path / "rec").iterdir())
    assert folders and not [f for f in folders if f.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.parametrize("sig, frames", [(signal.SIGTERM, 3), (signal.SIGHUP, 0)])
def test_a_signal_during_serve_record_finishes_or_removes_the_recording(sig, frames, tmp_path):
    """`serve --record` as a real process; the signal comes while the recording's temporary folder
    exists (after some frames, or at once): the process exits 128 + signal, leaving a complete
    recording or nothing, never a temporary folder."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    from alaya_flash.streaming.world.shading import PRESETS

    rec = tmp_path / "rec"
    store_prompts("", PRESETS["bright_sunny"].prompt)  # what it encodes as it starts: read back, MiniLM never loaded
    proc = subprocess.Popen(CLI + ["serve", "--random-model", "--record", "--record-dir", str(rec), "--port", str(port),
                                   "--size", "32"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(proc, lambda: rec.is_dir() and list(rec.glob(".live-*.alaya-tmp.tmp")), "serve starting to record")

        async def watch():
            async with aiohttp.ClientSession() as s, s.ws_connect(f"http://127.0.0.1:{port}/ws") as ws:
                await _frames(ws, frames, timeout=60)

        if frames:
            _run(watch())
        proc.send_signal(sig)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert code == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err
    left = sorted(p.name for p in rec.iterdir()) if rec.exists() else []
    assert not [n for n in left if n.startswith(".") or n.endswith(".tmp")], left
    if frames:  # a committed recording, readable to its end
        import av

        assert len(left) == 1
        with av.open(str(rec / left[0] / "rgb.mp4")) as video:
            assert sum(1 for _ in video.decode(video=0)) >= frames
    for name in left:  # whatever is there is a whole recording
        assert sorted(p.name for p in (rec / name).iterdir()) == [OUTPUT_MARK, "controls.jsonl", "rgb.mp4"]


def test_a_recording_sweeps_what_a_killed_server_left(tmp_path):
    import os

    from alaya_flash.streaming.live.recorder import Recorder

    rec = tmp_path / "rec"
    dead = rec / ".live-20260101-000000.999999999-0123abcd.alaya-tmp.tmp"  # no such process
    alive = rec / f".live-20260101-000001.{os.getpid()}-0123abcd.alaya-tmp.tmp"  # a running server's
    mine = rec / ".live-notes.tmp"  # not a name this program makes
    for d in (dead, alive, mine):
        d.mkdir(parents=True)
    r = Recorder(rec / "live-20260102-000000", fps=30)
    r.abort()
    assert sorted(p.name for p in rec.iterdir()) == sorted([alive.name, mine.name])


def test_a_token_guards_the_page_the_websocket_and_engine_sessions():
    """With a token every request needs it: ?token= once, then the cookie the page gets; an engine
    client given the printed address carries it to /engine. Without it: 401, one line."""
    from alaya_flash.client import Client, ClientError

    token = "s3cret-token-value"
    server = start_server(token=token)

    async def probe():
        async with aiohttp.ClientSession() as bare:
            async with bare.get(server.url) as r:
                refused = (r.status, await r.text())
            with pytest.raises(aiohttp.WSServerHandshakeError):
                await bare.ws_connect(server.url + "ws")
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as page:  # as a browser: IP hosts too
            async with page.get(server.url + f"?token={token}") as r:
                page_status = r.status
            async with page.get(server.url + "static/app.js") as r:  # the cookie carries it on
                static_status = r.status
            ws = await page.ws_connect(server.url + "ws")
            await ws.close()
        return refused, page_status, static_status

    try:
        (status, text), page_status, static_status = asyncio.run(probe())
        assert status == 401 and text.startswith("unauthorized: this server needs its token") and text.count("\n") == 1
        assert page_status == 200 and static_status == 200
        with pytest.raises(ClientError):
            Client(server.url, timeout=10)
        with Client(server.url + f"?token={token}", timeout=30) as engine:
            assert engine.hello["type"] == "hello"
    finally:
        server.stop()


def test_serve_generates_a_token_beyond_loopback_and_checks_a_given_one():
    from alaya_flash.streaming.cli.commands.serve import serve_token

    assert serve_token("127.0.0.1", None) is None and serve_token("localhost", None) is None
    made = serve_token("0.0.0.0", None)
    assert made and len(made) >= 16 and made != serve_token("0.0.0.0", None)
    assert serve_token("127.0.0.1", "abcdefgh12") == "abcdefgh12"
    with pytest.raises(AlayaError, match="--token: use at least 8"):
        serve_token("0.0.0.0", "short")
