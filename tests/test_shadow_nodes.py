"""The light passes in the ComfyUI nodes: G-Buffers From Images takes an engine's shadow and sky images
(optional inputs), Load G-Buffers reads a folder's light passes; either way the G-buffers equal
GBuffers(..., shadow=..., sky=...) built directly, chunk by chunk as in one call."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.synthetic import synthetic_stream
from alaya_flash.streaming.gbuffer import LIGHT_PASSES
from alaya_flash.streaming.values import GBuffers
from stream_helpers import moving_shadow

H, W, N = 16, 24, 6
PASSES = ("albedo", "depth", "metallic", "normal", "roughness")
ARGS = {"encoding": "teacher", "depth_near": 0.5, "fps": 16.0}


@pytest.fixture(scope="module")
def teacher():
    return torch.from_numpy(np.stack(list(synthetic_stream(W, H, N, seed=5).teacher_frames())))


@pytest.fixture(scope="module")
def planes():
    return {"shadow": torch.from_numpy(moving_shadow(N, H, W, start=0, step=1, width=8, gradient=10, rows=slice(2, 9))),
            "sky": torch.from_numpy(moving_shadow(N, H, W, start=14, step=-2, width=6, gradient=9, rows=slice(5, 14)))}


def _images(teacher):
    """The five passes as IMAGE batches (what G-Buffers To Images gives)."""
    return dict(zip(PASSES, NODES["AlayaFlash_GBuffersToImages"]().run(gbuffers=GBuffers(teacher))))


def _grey(plane):
    """An engine's grey image of a pass, as RGB."""
    return plane.float().div(255)[..., None].expand(-1, -1, -1, 3)


def test_the_node_has_an_optional_input_per_light_pass():
    node = NODES["AlayaFlash_GBuffersFromImages"]
    assert tuple(node.INPUT_TYPES()["optional"]) == LIGHT_PASSES
    assert node.STREAM_INPUTS == PASSES + LIGHT_PASSES


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_gbuffers_from_images_takes_the_light_images(teacher, planes, name):
    node, plane = NODES["AlayaFlash_GBuffersFromImages"](), planes[name]
    (g,) = node.run(**_images(teacher), **{name: _grey(plane)}, **ARGS)
    assert torch.equal(g.images, teacher) and torch.equal(getattr(g, name), plane) and list(g.light_passes()) == [name]
    (plain,) = node.run(**_images(teacher), **ARGS)
    assert not plain.light_passes() and torch.equal(plain.images, teacher)
    # colour is averaged; one channel is read as is
    grey = _grey(plane)
    tinted = torch.stack([grey[..., 0], torch.zeros_like(grey[..., 0]), grey[..., 0] * 2], -1).clamp(0, 1)
    (g2,) = node.run(**_images(teacher), **{name: tinted}, **ARGS)
    assert torch.equal(getattr(g2, name), tinted.mean(-1).mul(255).round().to(torch.uint8))
    (g3,) = node.run(**_images(teacher), **{name: grey[..., :1]}, **ARGS)
    assert torch.equal(getattr(g3, name), plane)


def test_streamed_in_uneven_chunks_the_light_passes_stay_with_their_frames(teacher, planes):
    """The runner's path: the passes, the shadow and the sky images arrive in different chunks; the G-buffers
    out, joined, equal GBuffers(teacher, shadow=..., sky=...) and shade as it does."""
    from alaya_flash.model_zoo.light import Light
    from alaya_flash.streaming.render.lighting import LightSchedule, Shade

    stage = NODES["AlayaFlash_GBuffersFromImages"]().start_stream("teacher", 0.5, 16.0)
    images, grey = _images(teacher), {n: _grey(p) for n, p in planes.items()}
    outs = []
    for a, b, c, d, e, f in ((0, 1, 0, 3, 0, 0), (1, 4, 3, 3, 0, 5), (4, 6, 3, 6, 5, 6)):
        out = stage.step(**{k: v[a:b] for k, v in images.items()}, shadow=grey["shadow"][c:d] if d > c else None,
                         sky=grey["sky"][e:f] if f > e else None)
        outs += [] if out is None else [out[0]]
    assert stage.flush() is None
    got = GBuffers.concat(outs)
    want = GBuffers(teacher, **planes)
    assert torch.equal(got.images, want.images)
    assert all(torch.equal(getattr(got, n), getattr(want, n)) for n in LIGHT_PASSES)
    light = LightSchedule.constant(Light(sun_azimuth=-30.0, sun_elevation=40.0))
    assert torch.equal(Shade(light).step(got), Shade(light).step(want))


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_a_light_image_of_another_size_or_count_is_one_line(teacher, planes, name):
    node = NODES["AlayaFlash_GBuffersFromImages"]()
    small = planes[name].float().div(255)[:, :, :-4, None]
    with pytest.raises(AlayaError, match=rf"^G-Buffers From Images: {name} is 20x16, expected 24x16 like the passes$"):
        node.run(**_images(teacher), **{name: small}, **ARGS)
    short = planes[name].float().div(255)[:-1, ..., None]
    with pytest.raises(AlayaError, match=rf"different frame counts \(left over: .*'{name}': 0\}}"):
        node.run(**_images(teacher), **{name: short}, **ARGS)


def test_load_gbuffers_reads_a_folders_light_passes(tmp_path, teacher, planes):
    with sinks.PngSequenceSink(tmp_path / "clip") as sink:
        for i, images in enumerate(teacher.numpy()):
            sink.write(gbuffer=images, **{n: p[i].numpy() for n, p in planes.items()})
    g, count = NODES["AlayaFlash_LoadGBuffers"]().run(path=str(tmp_path / "clip"), layout="auto", start=0, frames=0,
                                                     stride=1, resize="stretch", width=0, height=0, chunk=4)
    assert count == N and torch.equal(g.images, teacher)
    assert all(torch.equal(getattr(g, n), planes[n]) for n in LIGHT_PASSES)
