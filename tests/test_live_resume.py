"""A dropped engine connection resumes (serve --resume-grace, alaya_flash.client): exactly once, the same frames.

The server keeps a session whose socket dropped (its stream state, prompt, unanswered frames) for
the grace period under the resume token its hello gave; the client reconnects and resumes it. The
sessions render with the real live Flash pipeline on tiny random weights (chunks of 1, then 4
frames; the prompt projection scaled up so a prompt change shows in raw frames), so "the same"
means byte-equal to a stream that never dropped. A TCP proxy between client and server loses bytes
in either direction and cuts connections, as a network does.
"""
import asyncio
import gc
import hashlib
import json
import socket
import threading
import time
import weakref

import aiohttp
import numpy as np
import pytest

from alaya_flash.client import AsyncClient, Client, ClientError

from live_helpers import listening_model_folder, start_flash_server, start_server

SIZE = 64
N = 13  # chunks [0], [1..4], [5..8], [9..12]
PROMPT_AT = 9  # a prompt change before frame 9: the last chunk renders with it


def _frames() -> list[np.ndarray]:
    rng = np.random.default_rng(12)
    return [rng.integers(0, 256, (5, SIZE, SIZE, 3), dtype=np.uint8) for _ in range(N)]


def _digest(image: np.ndarray) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()[:16]


class Proxy:
    """A TCP forwarder on 127.0.0.1 that can lose what passes (lose_up: engine -> server, lose_down:
    server -> engine), cut every connection (reset), and refuse new ones."""

    def __init__(self, port: int):
        self.target, self.lose_up, self.lose_down, self.refuse = port, False, False, False
        self._pairs: list[tuple[asyncio.Transport, asyncio.Transport]] = []
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve():
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/"
            ready.set()

        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        ready.wait(10)

    async def _handle(self, reader, writer):
        if self.refuse:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._pairs.append((writer.transport, up_writer.transport))
        await asyncio.gather(self._pipe(reader, up_writer, "lose_up"), self._pipe(up_reader, writer, "lose_down"),
                             return_exceptions=True)

    async def _pipe(self, reader, writer, lose: str):
        try:
            while data := await reader.read(1 << 16):
                if not getattr(self, lose):
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.transport.abort()

    def cut(self) -> None:
        """Reset every connection (both ends see it drop) and pass bytes again for new ones."""
        def cut():
            for a, b in self._pairs:
                a.abort()
                b.abort()
            self._pairs.clear()
            self.lose_up = self.lose_down = False

        self._loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return listening_model_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def flash_server(model_dir):
    server = start_flash_server(model_dir, SIZE)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(flash_server):
    """Digests of the stream that never dropped: with the prompt change before frame 9, and without."""
    frames, out = _frames(), {}
    for prompt in ("heavy rain at night", None):
        with Client(flash_server.url) as client:
            for n, g in enumerate(frames):
                if n == PROMPT_AT and prompt:
                    client.set_prompt(prompt)
                client.send(n, g)
            got = [client.receive(timeout=120) for _ in range(N)]
        assert [f.number for f in got] == list(range(N))
        out[prompt] = [_digest(f.image) for f in got]
    assert out["heavy rain at night"][:PROMPT_AT] == out[None][:PROMPT_AT]
    assert all(a != b for a, b in zip(out["heavy rain at night"][PROMPT_AT:], out[None][PROMPT_AT:]))
    return out["heavy rain at night"]


def _until(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_network_drop_loses_nothing_both_ways(flash_server, reference):
    """Frames 5..8 render and their answers are lost on the way back; the prompt and frames 9..12 are
    lost on the way out; then the connection resets. The async client resumes: the server writes
    5..8 again, the client sends the prompt and 9..12 again, and every frame comes back once, in
    order, byte-equal to the stream that never dropped."""
    frames, proxy = _frames(), Proxy(int(flash_server.url.rsplit(":", 1)[1].strip("/")))

    async def run():
        async with AsyncClient(proxy.url, reconnect=30) as client:
            assert client.hello["resume"] and client.hello["resume_grace"] == 30
            link = flash_server.sessions[client.hello["session"]]
            for n in range(5):
                await client.send(n, frames[n])
            got = [await client.receive(timeout=120) for _ in range(5)]
            proxy.lose_down = True
            for n in range(5, 9):
                await client.send(n, frames[n])
            await asyncio.to_thread(_until, lambda: link.outbox.answered == 9)  # written, never arriving
            proxy.lose_up = True
            await client.set_prompt("heavy rain at night")
            for n in range(9, N):
                await client.send(n, frames[n])
            await asyncio.sleep(0.3)
            lost = (link.received, client._back)  # the server has 9 frames, the client 5 answers
            proxy.cut()
            got += [await client.receive(timeout=120) for _ in range(N - 5)]
            return got, lost, client.resumes

    try:
        got, lost, resumes = asyncio.run(run())
    finally:
        proxy.close()
    assert lost == (9, 5) and resumes == 1
    assert [f.number for f in got] == list(range(N)) and [f.index for f in got] == list(range(N))
    assert [_digest(f.image) for f in got] == reference


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_socket_shut_on_either_side_resumes_with_the_same_frames(flash_server, reference, side):
    """The blocking client: its socket (or the server's end of it) is shut down mid-stream, with frames
    in flight both ways; it reconnects, resumes, and gets exactly the frames of the stream that never dropped."""
    frames = _frames()
    with Client(flash_server.url, reconnect=30) as client:
        for n in range(PROMPT_AT):
            client.send(n, frames[n])
        got = [client.receive(timeout=120) for _ in range(3)]
        ws = flash_server.sessions[client.hello["session"]].ws if side == "server" else client._async._ws
        ws.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        client.set_prompt("heavy rain at night")
        for n in range(PROMPT_AT, N):
            client.send(n, frames[n])
        got += [client.receive(timeout=120) for _ in range(N - 3)]
        assert client.resumes >= 1
    assert [f.number for f in got] == list(range(N))
    assert [_digest(f.image) for f in got] == reference


def test_a_session_not_resumed_in_time_ends_and_frees_its_state():
    """Kept 1 s: the client, kept away by the proxy for 3 s, gets the server's one line when it comes
    back; by then the session has left the server, its render thread has ended and its renderer
    (the stream state) is garbage."""
    server = start_server(autostart=False, resume_grace=1.0)
    proxy = Proxy(int(server.url.rsplit(":", 1)[1].strip("/")))
    try:
        with Client(proxy.url, reconnect=30) as client:
            for n, g in enumerate(_frames()[:8]):
                client.send(n, g)
            assert [client.receive(timeout=30).number for _ in range(7)] == list(range(7))  # the tint holds 7
            sid = client.hello["session"]
            link = server.sessions[sid]
            renderer, outbox = weakref.ref(link.session.renderer), weakref.ref(link.outbox)
            thread = link.session._thread
            del link
            proxy.refuse = True
            proxy.cut()
            _until(lambda: sid not in server.sessions, 10)
            threading.Timer(2.0, setattr, (proxy, "refuse", False)).start()
            _until(lambda: client._async._failure, 30)
            with pytest.raises(ClientError) as err:
                client.poll()
        thread.join(10)
        gc.collect()
        assert not thread.is_alive() and renderer() is None and outbox() is None
        assert str(err.value).startswith("the connection dropped and the session could not be resumed: resume: no "
                                         "session to resume with this token (unknown, or not resumed within the 1 s")
        assert "\n" not in str(err.value)
    finally:
        proxy.close()
        server.stop()


def test_resume_refusals_are_one_line_and_grace_zero_ends_a_dropped_session():
    """An unknown token, a bad `have`, or a `have` the server cannot replay from get one fatal line each;
    with --resume-grace 0 the hello offers no token and a drop ends the session at once."""
    server = start_server(autostart=False)

    async def refusal(query: str) -> str:
        async with aiohttp.ClientSession() as http, http.ws_connect(server.url + "engine?" + query) as ws:
            msg = json.loads((await ws.receive(timeout=30)).data)
            assert msg["type"] == "error" and msg["fatal"]
            assert (await ws.receive(timeout=30)).type == aiohttp.WSMsgType.CLOSE
            return msg["message"]

    try:
        with Client(server.url) as client:
            token = client.hello["resume"]
            says = [asyncio.run(refusal(q)) for q in ("resume=nope", f"resume={token}&have=x",
                                                        f"resume={token}&have=99")]
        assert says[0].startswith("resume: no session to resume with this token")
        assert says[1] == "resume: have='x' must be the number of answers (frames and frame errors) received"
        assert says[2].startswith("resume: the client has 99 answers, but the session has 0")
    finally:
        server.stop()

    server = start_server(autostart=False, resume_grace=0.0)
    try:
        with Client(server.url) as client:
            assert client.hello["resume_grace"] == 0 and "resume" not in client.hello
            client._async._ws.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
            _until(lambda: client._async._failure, 30)
            with pytest.raises(ClientError, match=r"^the connection to session 1 dropped and this client does not "
                                                  r"resume it \(the server keeps no dropped session: serve --resume-grace\)$"):
                client.poll()
        _until(lambda: not server.sessions, 10)
    finally:
        server.stop()
