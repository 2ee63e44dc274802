"""The shadow pass in the ComfyUI nodes: G-Buffers From Images takes an engine's shadow images (optional),
Load G-Buffers reads a folder's shadow pass; either way the G-buffers equal GBuffers(..., shadow=...)
built directly, chunk by chunk as in one call."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.synthetic import synthetic_stream
from alaya_flash.streaming.values import GBuffers
from stream_helpers import moving_shadow

H, W, N = 16, 24, 6
PASSES = ("albedo", "depth", "metallic", "normal", "roughness")


@pytest.fixture(scope="module")
def teacher():
    return torch.from_numpy(np.stack(list(synthetic_stream(W, H, N, seed=5).teacher_frames())))


@pytest.fixture(scope="module")
def shadows():
    return torch.from_numpy(moving_shadow(N, H, W, start=0, step=1, width=8, gradient=10, rows=slice(2, 9)))


def _images(teacher):
    """The five passes as IMAGE batches (what G-Buffers To Images gives)."""
    return dict(zip(PASSES, NODES["AlayaFlash_GBuffersToImages"]().run(gbuffers=GBuffers(teacher))))


def test_gbuffers_from_images_takes_the_shadow_images(teacher, shadows):
    node = NODES["AlayaFlash_GBuffersFromImages"]()
    grey = shadows.float().div(255)[..., None].expand(-1, -1, -1, 3)  # an engine's grey image, as RGB
    (g,) = node.run(**_images(teacher), shadow=grey, encoding="teacher", depth_near=0.5, fps=16.0)
    assert torch.equal(g.images, teacher) and torch.equal(g.shadow, shadows)
    (plain,) = node.run(**_images(teacher), encoding="teacher", depth_near=0.5, fps=16.0)
    assert plain.shadow is None and torch.equal(plain.images, teacher)
    # colour is averaged; one channel is read as is
    tinted = torch.stack([grey[..., 0], torch.zeros_like(grey[..., 0]), grey[..., 0] * 2], -1).clamp(0, 1)
    (g2,) = node.run(**_images(teacher), shadow=tinted, encoding="teacher", depth_near=0.5, fps=16.0)
    assert torch.equal(g2.shadow, tinted.mean(-1).mul(255).round().to(torch.uint8))
    (g3,) = node.run(**_images(teacher), shadow=grey[..., :1], encoding="teacher", depth_near=0.5, fps=16.0)
    assert torch.equal(g3.shadow, shadows)


def test_streamed_in_uneven_chunks_the_shadow_stays_with_its_frames(teacher, shadows):
    """The runner's path: the passes and the shadow images arrive in different chunks; the G-buffers out,
    joined, equal GBuffers(teacher, shadow=...) and shade as it does."""
    from alaya_flash.model_zoo.light import Light
    from alaya_flash.streaming.render.lighting import LightSchedule, Shade

    stage = NODES["AlayaFlash_GBuffersFromImages"]().start_stream("teacher", 0.5, 16.0)
    images, grey = _images(teacher), shadows.float().div(255)[..., None].expand(-1, -1, -1, 3)
    outs = []
    for a, b, c, d in ((0, 1, 0, 3), (1, 4, 3, 3), (4, 6, 3, 6)):
        out = stage.step(**{k: v[a:b] for k, v in images.items()}, shadow=grey[c:d] if d > c else None)
        outs += [] if out is None else [out[0]]
    assert stage.flush() is None
    got = GBuffers.concat(outs)
    want = GBuffers(teacher, shadow=shadows)
    assert torch.equal(got.images, want.images) and torch.equal(got.shadow, want.shadow)
    light = LightSchedule.constant(Light(sun_azimuth=-30.0, sun_elevation=40.0))
    assert torch.equal(Shade(light).step(got), Shade(light).step(want))


def test_a_shadow_image_of_another_size_or_count_is_one_line(teacher, shadows):
    node = NODES["AlayaFlash_GBuffersFromImages"]()
    small = shadows.float().div(255)[:, :, :-4, None]
    with pytest.raises(AlayaError, match=r"^G-Buffers From Images: shadow is 20x16, expected 24x16 like the passes$"):
        node.run(**_images(teacher), shadow=small, encoding="teacher", depth_near=0.5, fps=16.0)
    short = shadows.float().div(255)[:-1, ..., None]
    with pytest.raises(AlayaError, match=r"different frame counts \(left over: .*'shadow': 0\}"):
        node.run(**_images(teacher), shadow=short, encoding="teacher", depth_near=0.5, fps=16.0)


def test_load_gbuffers_reads_a_folders_shadow_pass(tmp_path, teacher, shadows):
    with sinks.PngSequenceSink(tmp_path / "clip") as sink:
        for images, s in zip(teacher.numpy(), shadows.numpy()):
            sink.write(gbuffer=images, shadow=s)
    g, count = NODES["AlayaFlash_LoadGBuffers"]().run(path=str(tmp_path / "clip"), layout="auto", start=0, frames=0,
                                                     stride=1, resize="stretch", width=0, height=0, chunk=4)
    assert count == N and torch.equal(g.images, teacher) and torch.equal(g.shadow, shadows)
