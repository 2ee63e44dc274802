"""WebRTC video on the live page (streaming/live/webrtc.py, aiortc) and its JPEG fallback.

The browser tests run Debian's headless Chromium against a 64x64 server rendering with the tint
renderer double (albedo averaged with a colour hashed from the prompt), so a prompt change moves
the picture's mean colour by a known amount: the pixels read back from the <video> element must
follow it. Signalling refusals are checked on a bare WebSocket.
"""
import asyncio
import logging
import hashlib
import json

import aiohttp
import numpy as np
import pytest

from alaya_flash.streaming.live import webrtc
from alaya_flash.streaming.live.protocol import MAX_MESSAGE_BYTES, MAX_SDP_MESSAGE_BYTES, ProtocolError, parse_message

from browser_helpers import chromium, needs_chromium
from live_helpers import start_server
from test_live_browser import wait_for

needs_aiortc = pytest.mark.skipif(webrtc.unavailable() is not None, reason="needs aiortc (the webrtc extra)")

MEAN_JS = """
const v = document.getElementById('rtc');
if (!v.videoWidth) return null;
const c = document.createElement('canvas'); c.width = v.videoWidth; c.height = v.videoHeight;
const g = c.getContext('2d'); g.drawImage(v, 0, 0);
const d = g.getImageData(0, 0, c.width, c.height).data; const m = [0, 0, 0];
for (let i = 0; i < d.length; i += 4) { m[0] += d[i]; m[1] += d[i + 1]; m[2] += d[i + 2]; }
return m.map((x) => x / (d.length / 4));
"""


def tint(prompt: str) -> np.ndarray:
    """TintRenderer's colour for a prompt."""
    return np.frombuffer(hashlib.sha256(prompt.encode()).digest()[:3], np.uint8).astype(float)


def far_prompts():
    """Two prompts whose tints differ by at least 100 levels in some channel."""
    names = [f"style {i}" for i in range(200)]
    return max(((a, b) for a in names[:20] for b in names), key=lambda ab: np.abs(tint(ab[0]) - tint(ab[1])).max())


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    try:
        yield driver
    finally:
        driver.quit()


def set_prompt(driver, text):
    driver.execute_script("send({type: 'prompt', text: arguments[0]})", text)
    wait_for(driver, f"window.alaya.status && window.alaya.status.prompt === {text!r}", what="prompt applied")


@pytest.mark.slow
@needs_chromium
@needs_aiortc
def test_webrtc_video_follows_the_prompt(browser):
    a, b = far_prompts()
    server = start_server(prompt=a)
    try:
        browser.get(server.url)
        wait_for(browser, "window.alaya.video === 'webrtc' && window.alaya.rtcFrames >= 5", timeout=60,
                 what="WebRTC frames")
        assert browser.execute_script("return document.getElementById('video-mode').textContent") == "WebRTC"
        wait_for(browser, "window.alaya.status.video === 'webrtc'", what="the server's side switched")
        # frame metadata matched by RTP timestamp: capture -> display for WebRTC frames too
        shown = wait_for(browser, "window.alaya.rtcMatched >= 5 && window.alaya.displayMs", what="matched frames")
        assert all(0 <= ms < 600_000 for ms in shown)
        last = browser.execute_script("return window.alaya.last")
        assert last["kind"] == "video" and last["index"] >= 0
        before = np.array(wait_for(browser, f"(() => {{ {MEAN_JS} }})()", what="pixels"))
        set_prompt(browser, b)
        want = (tint(b) - tint(a)) / 2  # the mean colour's expected move
        channel = int(np.abs(want).argmax())
        moved = wait_for(browser, f"""(() => {{ const m = (() => {{ {MEAN_JS} }})();
                         return m && Math.abs(m[{channel}] - {before[channel]}) > {abs(want[channel]) / 2} && m; }})()""",
                         what="the video's colour following the prompt")
        assert np.sign(moved[channel] - before[channel]) == np.sign(want[channel])
        assert not browser.execute_script("return window.alaya.errors")
    finally:
        browser.get("about:blank")
        server.stop()


@needs_chromium
def test_jpeg_when_forced_or_when_the_server_has_no_webrtc(browser):
    for query, options, note in [("?video=jpeg", {}, "chosen"),
                                 ("", {"use_webrtc": False}, "turned off")]:
        server = start_server(**options)
        try:
            browser.get(server.url + query)
            wait_for(browser, "window.alaya.history.filter(r => r.kind === 'rgb').length >= 3", what="JPEG frames")
            assert browser.execute_script("return document.getElementById('video-mode').textContent") == \
                "JPEG over WebSocket"
            assert note in browser.execute_script("return window.alaya.videoNote")
            assert browser.execute_script("return window.alaya.rtcFrames") == 0
            assert wait_for(browser, "window.alaya.status.video", what="a status") == "jpeg"
        finally:
            browser.get("about:blank")
            server.stop()


def test_without_aiortc_the_server_says_why(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aiortc" else real(name, *a))
    assert "aiortc is not installed" in webrtc.unavailable()


def test_signalling_messages_are_checked():
    assert parse_message('{"type": "webrtc", "on": true}').args == {"on": True}
    sdp = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\n"
    assert parse_message(json.dumps({"type": "answer", "sdp": sdp})).args == {"sdp": sdp}
    big = "v=0\r\n" + "a=x\r\n" * 1000  # ~5 KB: over the general limit, within the answer's
    assert parse_message(json.dumps({"type": "answer", "sdp": big}, separators=(",", ":"))).type == "answer"
    bad = [
        ({"type": "webrtc", "on": "yes"}, "must be true or false"),
        ({"type": "answer", "sdp": "hello"}, "starting with 'v=0'"),
        ({"type": "answer", "sdp": 5}, "starting with 'v=0'"),
        ({"type": "answer", "sdp": "v=0\r\ns=\u00e9\r\n"}, "not printable ASCII"),
        ({"type": "answer", "sdp": "v=0\r\n\x00\r\n"}, "not printable ASCII"),
        ({"type": "answer", "sdp": sdp, "type2": 1}, "unknown field"),
        ({"type": "answer", "sdp": "v=0\r\n" + "a" * MAX_SDP_MESSAGE_BYTES}, "over the limit of 16384"),
    ]
    for msg, words in bad:
        with pytest.raises(ProtocolError, match=words):
            parse_message(json.dumps(msg))
    # a duplicate "type" cannot smuggle a long message of another type past the general limit
    smuggled = '{"type":"answer","text":"' + "x" * MAX_MESSAGE_BYTES + '","type":"prompt"}'
    with pytest.raises(ProtocolError, match=f"over the limit of {MAX_MESSAGE_BYTES}"):
        parse_message(smuggled)
    assert parse_message('{"type": "webrtc"}').args == {"on": False}  # like "passes": off when absent


async def _replies(url, messages, timeout=30.0):
    """Send each message (a list: sent together) and take the first error, offer or pong after it."""
    out = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
        for msg in messages:
            for m in msg if isinstance(msg, list) else [msg]:
                await ws.send_str(json.dumps(m))
            while True:
                got = await ws.receive(timeout=timeout)
                assert got.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), got
                data = json.loads(got.data) if got.type == aiohttp.WSMsgType.TEXT else {}
                if data.get("type") in ("error", "offer", "pong"):
                    out.append(data.get("message", f"({data['type']})"))
                    break
    return out


def test_bad_signalling_is_refused_per_message():
    server = start_server(use_webrtc=False)
    try:
        got = asyncio.run(_replies(server.url, [{"type": "webrtc", "on": True},
                                                {"type": "answer", "sdp": "v=0\r\n"}]))
    finally:
        server.stop()
    assert all("this server has no WebRTC (turned off" in line for line in got)


@needs_aiortc
def test_signalling_order_and_unusable_answers_are_refused():
    server = start_server()
    try:
        got = asyncio.run(_replies(server.url, [
            {"type": "answer", "sdp": "v=0\r\n"},                # no offer yet
            {"type": "webrtc", "on": True},                      # -> the offer
            {"type": "webrtc", "on": True},                      # one at a time
            {"type": "answer", "sdp": "v=0\r\nnonsense\r\n"},    # aiortc cannot use it: closed
            {"type": "webrtc", "on": True},                      # so a new one may start
            [{"type": "webrtc", "on": False}, {"type": "ping", "t": 1}],  # no error: the pong comes first
        ]))
    finally:
        server.stop()
    assert "no WebRTC offer is waiting" in got[0]
    assert got[1] == "(offer)"
    assert "already open or being set up" in got[2]
    assert got[3].startswith("answer: the SDP could not be used (") and "\n" not in got[3]
    assert got[4] == "(offer)"
    assert got[5] == "(pong)"


def test_candidate_addresses_are_read_from_every_candidate_line():
    sdp = ("v=0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host\r\n"
           "a=candidate:2 1 udp 2130706431 203.0.113.5 5001 typ host\r\na=candidate:3 1 udp\r\n")
    assert webrtc.candidate_addresses(sdp) == ["127.0.0.1", "203.0.113.5", "a=candidate:3 1 udp"]


def test_a_loopback_server_drops_the_candidates_that_name_other_addresses():
    """The server never reaches out to an address an answer names off this machine (a browser lists
    its other interfaces, or mDNS names): those candidate lines go before aiortc reads the answer."""
    sdp = ("v=0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host\r\n"
           "a=candidate:2 1 udp 2130706431 203.0.113.5 5001 typ host\r\n"
           "a=candidate:3 1 udp 2130706431 1f2e3d4c.local 5002 typ host\r\na=end-of-candidates\r\n")
    kept, dropped = webrtc.loopback_candidates_only(sdp)
    assert dropped == ["203.0.113.5", "1f2e3d4c.local"]
    assert webrtc.candidate_addresses(kept) == ["127.0.0.1"] and "a=end-of-candidates" in kept


def test_a_failed_connection_tells_the_page_why():
    """ICE that finds no pair (an answer whose candidates cannot be reached) ends in one error line and
    the viewer back on JPEG, not a silent close."""
    from alaya_flash.streaming.live.server import LiveServer
    from alaya_flash.streaming.live.transport import Client

    class Peer:
        state = "failed"

        async def close(self):
            self.state = "closed"

    async def run():
        async def nothing(_):
            return None

        server = LiveServer.__new__(LiveServer)
        server._rtc_tasks = set()
        client, peer = Client(nothing, nothing), Peer()
        client.rtc = peer
        server._rtc_state(client, peer)
        await asyncio.gather(*server._rtc_tasks)
        return client, peer

    client, peer = asyncio.run(run())
    replies = [json.loads(r) for r in client.replies]
    assert replies[0]["type"] == "error" and "no usable ICE candidate" in replies[0]["message"]
    assert replies[-1] == {"type": "webrtc", "state": "failed"}
    assert client.rtc is None and "rgb" in client.wants and peer.state == "closed"


@needs_aiortc
def test_a_peer_closed_while_it_connects_logs_no_traceback(caplog):
    """aiortc starts its connect task with ensure_future and never awaits it (rtcpeerconnection.py,
    setRemoteDescription); when the server closes a peer whose ICE failed while that task runs, the
    task ends in InvalidStateError, which asyncio logged as 'Task exception was never retrieved' with a
    traceback on serve's console (the page hears of the failure in one line already). Here aiortc's
    pattern, its task failing as it did, under RtcPeer.answer."""
    import gc

    from aiortc.exceptions import InvalidStateError

    class Viewer:  # what RtcPeer uses of a viewer
        dropped = sent = 0

    class Connecting:
        async def setRemoteDescription(self, description):
            asyncio.ensure_future(self.__connect())

        async def __connect(self):
            await asyncio.sleep(0)
            raise InvalidStateError("RTCIceTransport is closed")

    async def run():
        peer = webrtc.RtcPeer(Viewer(), loopback=True, on_state=lambda p: None)
        await peer.pc.close()
        peer.pc = Connecting()
        await peer.answer("v=0\r\n")
        await asyncio.sleep(0.1)

    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        asyncio.run(run())
        gc.collect()
    assert "never retrieved" not in caplog.text and "InvalidStateError" not in caplog.text
