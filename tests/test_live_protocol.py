"""The live page's protocol checks and the transport's bounded, non-blocking fan-out."""
import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alaya_flash.streaming.live.protocol import (
    MAX_DEPTH,
    MAX_MESSAGE_BYTES,
    ProtocolError,
    RateLimiter,
    parse_message,
)
from alaya_flash.streaming.live.transport import MAX_REPLIES, Hub

CTX = {"presets": ["bright_sunny", "overcast"], "sources": ("world", "file")}


def test_valid_messages_parse():
    assert parse_message('{"type": "control", "action": "pause"}', CTX).args == {"action": "pause"}
    assert parse_message('{"type": "prompt", "text": "  a snowy street "}', CTX).args == {"text": "a snowy street"}
    assert parse_message('{"type": "preset", "name": "overcast"}', CTX).args == {"name": "overcast"}
    cmd = parse_message(json.dumps({"type": "input", "move": [0, 1], "yaw": 3, "jump": True}), CTX)
    assert cmd.args == {"move": (0.0, 1.0), "yaw": 3.0, "pitch": 0.0, "zoom": 0.0, "jump": True, "push": False}


@pytest.mark.parametrize("raw, words", [
    (b"\x00\x01", "binary"),
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"type": "explode"}', "unknown message type"),
    ('{"action": "start"}', "unknown message type"),
    ('{"type": "control", "action": "format-disk"}', "must be one of"),
    ('{"type": "control", "action": "start", "extra": 1}', "unknown field"),
    ('{"type": "prompt", "text": ""}', "non-empty string"),
    ('{"type": "prompt", "text": 5}', "non-empty string"),
    ('{"type": "prompt", "text": "' + "x" * 1001 + '"}', "at most 1000"),
    ('{"type": "preset", "name": "../../etc"}', "must be one of"),
    ('{"type": "input", "move": [0, 2]}', "[-1, 1]"),
    ('{"type": "input", "move": [0]}', "two numbers"),
    ('{"type": "input", "yaw": 1e400}', "number in"),
    ('{"type": "input", "yaw": NaN}', "number in"),
    ('{"type": "input", "jump": "yes"}', "true or false"),
    ('{"type": "record", "on": 1}', "true or false"),
    ('{"type": "prompt", "text": "' + "y" * MAX_MESSAGE_BYTES + '"}', "over the limit"),
    # hostile pages (issue #34): a lone surrogate, deep nesting, numbers no float can hold
    ('{"type": "prompt", "text": "a \\ud800 b"}', "character 3 ('\\ud800') is not valid Unicode"),
    ('{"type": "prompt", "text": "\\udfff"}', "not valid Unicode"),
    ('{"type": "\\ud800"}', "not valid Unicode"),
    ('{"type": "ping", "\\udc80": 1}', "not valid Unicode"),
    ('{"type": "input", "move": ["\\ud800", 0]}', "not valid Unicode"),
    ("[" * 4000, f"nests 4000 levels deep; the limit is {MAX_DEPTH} levels"),
    ('{"type": "ping", "t": ' + "[" * 2000 + "]" * 2000 + "}", "the limit is"),
    ('{"type": "input", "move": [[[[[0]]]], 0]}', "the limit is"),
    ('{"type": "ping", "t": ' + "9" * 4000 + "}", "must be a number in"),
    ('{"type": "input", "move": [-' + "9" * 3000 + ', 0]}', "must be a number in"),
    ('{"type": "ping", "t": 1e99999}', "must be a number in"),
])
def test_bad_messages_are_refused_with_a_line(raw, words):
    with pytest.raises(ProtocolError) as err:
        parse_message(raw, CTX)
    assert words in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_deep_strings_and_valid_text_pass():
    # brackets inside strings are not nesting; surrogate pairs (emoji) are valid text
    cmd = parse_message(json.dumps({"type": "prompt", "text": "[[[[[{{{{{ \U0001F600 \\\" ]"}), CTX)
    assert cmd.args["text"] == "[[[[[{{{{{ \U0001F600 \\\" ]"
    assert parse_message('{"type": "prompt", "text": "\\ud83d\\ude00"}', CTX).args["text"] == "\U0001F600"


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(
    st.text(max_size=300),
    st.binary(max_size=50),
    json_values.map(json.dumps),
    st.builds(lambda t, rest: json.dumps({"type": t, **rest}), st.sampled_from(["control", "prompt", "preset",
              "source", "input", "record", "passes", "ping", "x"]), st.dictionaries(
              st.sampled_from(["action", "text", "name", "move", "yaw", "pitch", "zoom", "jump", "push", "on", "t"]),
              json_values, max_size=3)),
    st.builds(lambda n, o: o * n, st.integers(0, 5000), st.sampled_from(["[", "{\"a\":", "[\"\\ud800\","]))))
def test_any_message_gives_a_command_or_one_protocol_error_line(raw):
    try:
        parse_message(raw, CTX)
    except ProtocolError as err:
        assert "\n" not in str(err) and len(str(err)) < 300
        str(err).encode("utf-8")  # the reply itself is sendable text


def test_rate_limiter_bounds_bursts_and_refills():
    now = [0.0]
    rl = RateLimiter(rate=10, burst=5, clock=lambda: now[0])
    assert [rl.allow() for _ in range(7)] == [True] * 5 + [False] * 2
    now[0] += 0.3  # 3 tokens back
    assert [rl.allow() for _ in range(4)] == [True] * 3 + [False]


def test_hub_keeps_one_frame_per_client_and_never_blocks():
    async def main():
        hub = Hub(asyncio.get_running_loop())
        sent_fast, gate = [], asyncio.Event()

        async def fast(data):
            sent_fast.append(data)

        async def stuck(data):  # a client that never reads: its send never completes
            await gate.wait()

        async def text(_):
            pass

        fast_c, slow_c = hub.add(fast, text), hub.add(stuck, text)
        pumps = [asyncio.ensure_future(c.pump()) for c in (fast_c, slow_c)]
        for i in range(200):
            hub.publish("rgb", bytes([i % 256]) * 10)  # what the render thread does
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        # the slow client holds at most one pending frame; the rest were dropped for it alone
        assert slow_c.pending() <= 1
        assert slow_c.sent == 0 and slow_c.dropped >= 190  # one frame is stuck in its send
        assert len(sent_fast) >= 190 and sent_fast[-1] == bytes([199]) * 10
        assert fast_c.dropped == 200 - len(sent_fast)
        for _ in range(100):
            slow_c.reply("x")
        assert len(slow_c.replies) == MAX_REPLIES
        gate.set()
        for c in (fast_c, slow_c):
            hub.remove(c)
        await asyncio.gather(*pumps, return_exceptions=True)

    asyncio.run(main())


def test_passes_only_go_to_clients_that_ask():
    async def main():
        hub = Hub(asyncio.get_running_loop())

        async def noop(_):
            await asyncio.sleep(3600)

        a, b = hub.add(noop, noop), hub.add(noop, noop)
        b.wants.add("passes")
        assert hub.wants("passes")
        hub.publish("passes", b"p")
        await asyncio.sleep(0)
        assert "passes" not in a.slot and b.slot["passes"] == b"p"

    asyncio.run(main())
