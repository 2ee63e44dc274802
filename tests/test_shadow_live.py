"""An engine's shadow pass on the live server: the wire's shadow plane (header flags bit 0), a session that
sends it with every frame or never, and the renderer handing it to the shading prior. Through the server
and `alaya_flash.client`, a stream with its shadow pass renders as the Flash pipeline renders
GBuffers(..., shadow=...) directly."""
import time

import numpy as np
import pytest

from alaya_flash.client import Client
from alaya_flash.streaming.live import wire
from alaya_flash.streaming.live.protocol import ProtocolError

from stream_helpers import moving_shadow, random_refiner

SIZE, N = 32, 9  # chunks of 1, 4, 4 frames (one latent frame a chunk)
PROMPT = "a sunny street, the sun on the left"


def _frames(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (N, 5, SIZE, SIZE, 3), dtype=np.uint8)


def _shadows():
    return moving_shadow(N, SIZE, SIZE, start=2, step=2, width=12)


def _close(a, b) -> bool:
    """Equal within one level: the live chunks and one whole step differ by float rounding (tests/test_user_light.py)."""
    return a.shape == b.shape and int(np.abs(a.astype(int) - b).max()) <= 1


def _model():
    from alaya_flash.model_zoo import bundle

    model = bundle.make_random_flash(seed=0)
    model.refiner = random_refiner("gbuffer-refiner-16-light")  # reads the prior: the shadows show in its frames
    return model


# ---- the wire ---------------------------------------------------------------------------------


def test_the_shadow_plane_round_trips_in_both_forms():
    teacher, shadow = _frames()[0], _shadows()[3]
    data = wire.pack_gbuffers(4, 1.5, teacher, shadow=shadow)
    assert len(data) == wire.HEADER_BYTES + 16 * SIZE * SIZE
    m = wire.unpack_gbuffers(data)
    assert np.array_equal(m.teacher_u8(), teacher) and np.array_equal(m.shadow_u8(), shadow)
    assert wire.unpack_gbuffers(wire.pack_gbuffers(4, 1.5, teacher)).shadow_u8() is None
    rng = np.random.default_rng(2)
    passes = {"albedo": rng.random((16, 48, 3), np.float32), "depth": rng.random((16, 48), np.float32) + 0.1,
              "metallic": rng.random((16, 48), np.float32), "normal": rng.random((16, 48, 3), np.float32),
              "roughness": rng.random((16, 48), np.float32)}
    vis = rng.random((16, 48), np.float32)
    m = wire.unpack_gbuffers(wire.pack_gbuffers(0, 0.0, passes, depth_near=0.25, shadow=vis))
    assert np.array_equal(m.shadow_u8(), np.rint(vis * 255).astype(np.uint8))
    assert all(np.array_equal(m.float_passes()[k], v) for k, v in passes.items())


def test_a_bad_shadow_plane_is_refused_in_one_line_before_sending():
    teacher = _frames()[0]
    with pytest.raises(ValueError, match=r"^frame 3: shadow has shape \(32, 16\), expected \(32, 32\) \(H, W\) like "
                                         r"the G-buffers$"):
        wire.pack_gbuffers(3, 0.0, teacher, shadow=np.zeros((SIZE, 16), np.uint8))
    with pytest.raises(ValueError, match="^frame 3: shadow has NaN or infinite values"):
        wire.pack_gbuffers(3, 0.0, teacher, shadow=np.full((SIZE, SIZE), np.nan, np.float32))
    with pytest.raises(ValueError, match="^frame 3: shadow must be uint8 .* got int64"):
        wire.pack_gbuffers(3, 0.0, teacher, shadow=np.zeros((SIZE, SIZE), np.int64))
    # a plane of another size than the header's is a payload the server refuses, naming what it expected
    data = wire.pack_gbuffers(3, 0.0, teacher, shadow=np.zeros((SIZE, SIZE), np.uint8))
    with pytest.raises(ProtocolError, match="^frame 3: payload of 16383 bytes, expected 16384 for 32x32 uint8 teacher "
                                            "form and a 32x32 uint8 shadow plane$"):
        wire.unpack_gbuffers(data[:-1])


# ---- the renderer and the server --------------------------------------------------------------


def _live(live, frames, shadows=None):
    out, i = [], 0
    while i < len(frames):
        n = live.chunk_frames
        out.append(live.render(frames[i:i + n]) if shadows is None else
                   live.render(frames[i:i + n], shadow=shadows[i:i + n]))
        i += n
    return np.concatenate(out)


def test_a_live_renderer_gives_the_shadow_pass_to_the_prior():
    """FlashLive.render(chunk, shadow=...) chunk by chunk = FlashPipeline on GBuffers(frames, shadow=...),
    and differs from the frames without the pass (the prior's own screen-space shadows)."""
    from alaya_flash.streaming.files.sinks import to_uint8
    from alaya_flash.streaming.live.renderers import FlashLive
    from alaya_flash.streaming.render import pipelines as pl
    from alaya_flash.streaming.render.lighting import prompt_lights
    from alaya_flash.streaming.values import GBuffers, PromptSchedule

    model, frames, shadows = _model(), _frames(), _shadows()
    live = FlashLive(model, seed=1, fps=30, chunk_latents=1)
    live.set_prompt(PROMPT)
    got = _live(live, frames, shadows)
    sched = PromptSchedule.constant(model.text_encoder()([PROMPT]), PROMPT)
    pipe = pl.FlashPipeline(model, sched, seed=1, chunk_frames=1, lights=prompt_lights(model, sched))
    want = to_uint8(pipe.step(GBuffers(frames, fps=30, shadow=shadows)))
    assert got.shape == (N, SIZE, SIZE, 3) and _close(got, want)
    live.reset()
    assert np.abs(_live(live, frames).astype(int) - got).max() > 8


@pytest.fixture(scope="module")
def shadow_server(tmp_path_factory):
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


def test_an_engine_sends_its_shadow_pass_with_each_frame(shadow_server):
    """Through the server: the frames of a session whose engine sends its shadow pass equal a live renderer's
    (the same factory) given that pass, and differ from a session's without it; a frame that breaks the
    session's choice is refused in one line."""
    server, make = shadow_server
    frames, shadows = _frames(), _shadows()
    local = make()
    local.set_prompt(PROMPT)
    want = _live(local, frames, shadows)
    with Client(server.url, prompt=PROMPT) as client:
        for n in range(N):
            client.send(n, frames[n], shadow=shadows[n])
        got = np.stack([client.receive(timeout=120).image for _ in range(N)])
        assert _close(got, want)
        client.send(N, frames[0])  # no shadow plane now
        assert _errors(client) == [
            f"frame {N}: has no shadow plane, but this session's frames carry one (its first frame decided); a "
            "session sends the shadow plane with every frame or never: open another session to change"]
    with Client(server.url, prompt=PROMPT) as client:  # a session without the pass: the prior's own shadows
        for n in range(N):
            client.send(n, frames[n])
        plain = np.stack([client.receive(timeout=120).image for _ in range(N)])
        assert np.abs(plain.astype(int) - got).max() > 8
        client.send(N, frames[0], shadow=shadows[0])
        assert _errors(client)[0].startswith(f"frame {N}: has a shadow plane, but this session's frames have none")


class _ShadowRenderer:
    """A renderer double that keeps the shadow passes it is given (one frame a chunk, none held back)."""

    chunk_frames, held_frames, light_problem = 1, 0, None
    seen: list = []

    def reset(self):
        pass

    def set_prompt(self, text):
        pass

    def set_light(self, light, offset=0):
        pass

    def render(self, chunk, shadow=None):
        type(self).seen.append(None if shadow is None else shadow.copy())
        return chunk[:, 0]


def test_the_pages_file_source_renders_with_the_files_shadow_pass(tmp_path):
    """`serve --source file` over a folder with a shadow pass: the page's renderer gets it with every frame,
    in the file's order, looped."""
    from alaya_flash.streaming.files.sinks import PngSequenceSink

    from live_helpers import start_server

    frames, shadows = _frames()[:3], _shadows()[:3]
    with PngSequenceSink(tmp_path / "clip") as sink:
        for images, s in zip(frames, shadows):
            sink.write(gbuffer=images, shadow=s)
    _ShadowRenderer.seen = []
    server = start_server(renderer=_ShadowRenderer, source="file", gbuffers=tmp_path / "clip", width=SIZE, height=SIZE)
    try:
        for _ in range(400):
            if len(_ShadowRenderer.seen) >= 5:
                break
            time.sleep(0.05)
    finally:
        server.stop()
    seen = _ShadowRenderer.seen[:5]
    assert len(seen) == 5 and all(s is not None and s.shape == (1, SIZE, SIZE) for s in seen)
    assert all(np.array_equal(s[0], shadows[k % 3]) for k, s in enumerate(seen))
