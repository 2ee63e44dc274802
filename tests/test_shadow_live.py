"""An engine's light passes on the live server: the wire's light planes (header flags bit 0 a shadow plane,
bit 1 a sky plane), a session that sends each with every frame or never, and the renderer handing them to
the shading prior. Through the server and `alaya_flash.client`, a stream with its light passes renders as
the Flash pipeline renders GBuffers(..., shadow=..., sky=...) directly."""
import time

import numpy as np
import pytest

from alaya_flash.client import Client
from alaya_flash.streaming.gbuffer import LIGHT_PASSES
from alaya_flash.streaming.live import wire
from alaya_flash.streaming.live.protocol import ProtocolError

from stream_helpers import moving_shadow, random_refiner

SIZE, N = 32, 9  # chunks of 1, 4, 4 frames (one latent frame a chunk)
PROMPT = "a sunny street, the sun on the left"
SETS = [("shadow",), ("sky",), LIGHT_PASSES]  # the light passes a session sends


def _frames(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (N, 5, SIZE, SIZE, 3), dtype=np.uint8)


def _planes():
    """A shadow band moving right, a band of blocked sky moving left."""
    return {"shadow": moving_shadow(N, SIZE, SIZE, start=2, step=2, width=12),
            "sky": moving_shadow(N, SIZE, SIZE, start=18, step=-2, width=12, edge=90)}


def _close(a, b) -> bool:
    """Equal within one level: the live chunks and one whole step differ by float rounding (tests/test_user_light.py)."""
    return a.shape == b.shape and int(np.abs(a.astype(int) - b).max()) <= 1


def _model():
    from alaya_flash.model_zoo import bundle

    model = bundle.make_random_flash(seed=0)
    model.refiner = random_refiner("gbuffer-refiner-16-sky")  # reads the prior: the light passes show in its frames
    return model


# ---- the wire ---------------------------------------------------------------------------------


@pytest.mark.parametrize("names", SETS, ids="+".join)
def test_the_light_planes_round_trip_in_both_forms(names):
    teacher = _frames()[0]
    planes = {n: p[3] for n, p in _planes().items() if n in names}
    data = wire.pack_gbuffers(4, 1.5, teacher, **planes)
    assert len(data) == wire.HEADER_BYTES + (15 + len(names)) * SIZE * SIZE
    assert wire.HEADER.unpack_from(data)[3] == sum(wire.LIGHT_FLAGS[n] for n in names)
    m = wire.unpack_gbuffers(data)
    got = m.light_u8()
    assert np.array_equal(m.teacher_u8(), teacher) and list(got) == list(names)
    assert all(np.array_equal(got[n], planes[n]) for n in names)
    assert wire.unpack_gbuffers(wire.pack_gbuffers(4, 1.5, teacher)).light_u8() == {}
    rng = np.random.default_rng(2)
    passes = {"albedo": rng.random((16, 48, 3), np.float32), "depth": rng.random((16, 48), np.float32) + 0.1,
              "metallic": rng.random((16, 48), np.float32), "normal": rng.random((16, 48, 3), np.float32),
              "roughness": rng.random((16, 48), np.float32)}
    vis = {n: rng.random((16, 48), np.float32) for n in names}
    m = wire.unpack_gbuffers(wire.pack_gbuffers(0, 0.0, passes, depth_near=0.25, **vis))
    assert all(np.array_equal(m.light_u8()[n], np.rint(vis[n] * 255).astype(np.uint8)) for n in names)
    assert all(np.array_equal(m.float_passes()[k], v) for k, v in passes.items())


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_a_bad_light_plane_is_refused_in_one_line_before_sending(name):
    teacher = _frames()[0]
    meaning = {"shadow": "the sun's visibility", "sky": "the share of the sky seen"}[name]
    with pytest.raises(ValueError, match=rf"^frame 3: {name} has shape \(32, 16\), expected \(32, 32\) \(H, W\) like "
                                         r"the G-buffers$"):
        wire.pack_gbuffers(3, 0.0, teacher, **{name: np.zeros((SIZE, 16), np.uint8)})
    with pytest.raises(ValueError, match=f"^frame 3: {name} has NaN or infinite values; it is {meaning}, 0 to 1$"):
        wire.pack_gbuffers(3, 0.0, teacher, **{name: np.full((SIZE, SIZE), np.nan, np.float32)})
    with pytest.raises(ValueError, match=f"^frame 3: {name} must be uint8 .* got int64"):
        wire.pack_gbuffers(3, 0.0, teacher, **{name: np.zeros((SIZE, SIZE), np.int64)})
    # a plane of another size than the header's is a payload the server refuses, naming what it expected
    data = wire.pack_gbuffers(3, 0.0, teacher, **{name: np.zeros((SIZE, SIZE), np.uint8)})
    with pytest.raises(ProtocolError, match="^frame 3: payload of 16383 bytes, expected 16384 for 32x32 uint8 teacher "
                                            f"form and a 32x32 uint8 {name} plane$"):
        wire.unpack_gbuffers(data[:-1])


# ---- the renderer and the server --------------------------------------------------------------


def _live(live, frames, planes=None):
    out, i = [], 0
    while i < len(frames):
        n = live.chunk_frames
        out.append(live.render(frames[i:i + n], **{k: p[i:i + n] for k, p in (planes or {}).items()}))
        i += n
    return np.concatenate(out)


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_a_live_renderer_gives_the_light_pass_to_the_prior(name):
    """FlashLive.render(chunk, shadow= / sky=) chunk by chunk = FlashPipeline on GBuffers(frames, ...), and
    differs from the frames without the pass (the prior's own screen-space shadows or ambient occlusion)."""
    from alaya_flash.streaming.files.sinks import to_uint8
    from alaya_flash.streaming.live.renderers import FlashLive
    from alaya_flash.streaming.render import pipelines as pl
    from alaya_flash.streaming.render.lighting import prompt_lights
    from alaya_flash.streaming.values import GBuffers, PromptSchedule

    model, frames, planes = _model(), _frames(), {name: _planes()[name]}
    live = FlashLive(model, seed=1, fps=30, chunk_latents=1)
    live.set_prompt(PROMPT)
    got = _live(live, frames, planes)
    sched = PromptSchedule.constant(model.text_encoder()([PROMPT]), PROMPT)
    pipe = pl.FlashPipeline(model, sched, seed=1, chunk_frames=1, lights=prompt_lights(model, sched))
    want = to_uint8(pipe.step(GBuffers(frames, fps=30, **planes)))
    assert got.shape == (N, SIZE, SIZE, 3) and _close(got, want)
    live.reset()
    assert np.abs(_live(live, frames).astype(int) - got).max() > 8


@pytest.fixture(scope="module")
def light_server(tmp_path_factory):
    from alaya_flash.model_zoo import bundle
    from alaya_flash.streaming.live.renderers import renderer_factory

    from live_helpers import start_server

    folder = bundle.save_flash(_model(), tmp_path_factory.mktemp("models") / "light")
    make = renderer_factory(model=folder, chunk_latents=1, fps=30.0)
    server = start_server(renderer=make, width=SIZE, height=SIZE, autostart=False)
    server.page.ready.wait(120)
    yield server, make
    server.stop()


def _errors(client) -> list[str]:
    """The server's refusals once one has come (at most 10 s)."""
    for _ in range(200):
        if client.errors:
            break
        time.sleep(0.05)
    return list(client.errors)


def _session(server, frames, planes) -> np.ndarray:
    with Client(server.url, prompt=PROMPT) as client:
        for n in range(N):
            client.send(n, frames[n], **{k: p[n] for k, p in planes.items()})
        return np.stack([client.receive(timeout=120).image for _ in range(N)])


def test_an_engine_sends_its_light_passes_with_each_frame(light_server):
    """Through the server: the frames of sessions whose engine sends its shadow pass, its sky pass or both equal
    a live renderer's (the same factory) given those passes, and differ from a session's without them and from
    each other; a frame that breaks the session's choice is refused in one line naming the plane."""
    server, make = light_server
    frames, planes = _frames(), _planes()
    plain = _session(server, frames, {})
    got = {}
    for names in SETS:
        given = {n: planes[n] for n in names}
        local = make()
        local.set_prompt(PROMPT)
        got[names] = _session(server, frames, given)
        assert _close(got[names], _live(local, frames, given)), names
        assert np.abs(plain.astype(int) - got[names]).max() > 8, names
    assert np.abs(got[("shadow",)].astype(int) - got[LIGHT_PASSES]).max() > 8
    with Client(server.url, prompt=PROMPT) as client:
        client.send(0, frames[0], shadow=planes["shadow"][0], sky=planes["sky"][0])
        client.send(1, frames[1], shadow=planes["shadow"][1])  # no sky plane now
        assert _errors(client) == [
            "frame 1: has no sky plane, but this session's frames carry one (its first frame decided); a session "
            "sends the sky plane with every frame or never: open another session to change"]
    with Client(server.url, prompt=PROMPT) as client:  # a session without the passes: the prior's own
        client.send(0, frames[0])
        client.send(1, frames[1], sky=planes["sky"][1])
        assert _errors(client)[0].startswith("frame 1: has a sky plane, but this session's frames have none")


class _LightRenderer:
    """A renderer double that keeps the light passes it is given (one frame a chunk, none held back)."""

    chunk_frames, held_frames, light_problem = 1, 0, None
    seen: list = []

    def reset(self):
        pass

    def set_prompt(self, text):
        pass

    def set_light(self, light, offset=0):
        pass

    def render(self, chunk, **light):
        type(self).seen.append({k: v.copy() for k, v in light.items()})
        return chunk[:, 0]


def test_the_pages_file_source_renders_with_the_files_light_passes(tmp_path):
    """`serve --source file` over a folder with a shadow and a sky pass: the page's renderer gets both with every
    frame, in the file's order, looped."""
    from alaya_flash.streaming.files.sinks import PngSequenceSink

    from live_helpers import start_server

    frames, planes = _frames()[:3], {k: p[:3] for k, p in _planes().items()}
    with PngSequenceSink(tmp_path / "clip") as sink:
        for i, images in enumerate(frames):
            sink.write(gbuffer=images, **{k: p[i] for k, p in planes.items()})
    _LightRenderer.seen = []
    server = start_server(renderer=_LightRenderer, source="file", gbuffers=tmp_path / "clip", width=SIZE, height=SIZE)
    try:
        for _ in range(400):
            if len(_LightRenderer.seen) >= 5:
                break
            time.sleep(0.05)
    finally:
        server.stop()
    seen = _LightRenderer.seen[:5]
    assert len(seen) == 5 and all(list(s) == list(LIGHT_PASSES) for s in seen)
    for k, s in enumerate(seen):
        for name in LIGHT_PASSES:
            assert s[name].shape == (1, SIZE, SIZE) and np.array_equal(s[name][0], planes[name][k % 3]), (k, name)
