"""A student that reads the light through the G-buffer encoder (model_zoo/codecs/gbuffer_encoder.py's sixth
branch, training/light_reading.py): the shading prior's image enters as the sixth plane, chunked streams
equal whole ones, the light set mid-stream reaches the encoder from its frame, and a five-branch student
widened to read it renders exactly what it rendered before. student-rollout's reads_light: test_training_student.py."""
import json

import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.model_zoo.codecs import gbuffer_encoder
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError
from alaya_flash.model_zoo.light import Light, pack
from alaya_flash.model_zoo.shading_prior import ShadingPrior
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.render.lighting import LightSchedule, prompt_lights
from alaya_flash.streaming.values import GBuffers, PromptSchedule
from stream_helpers import moving_shadow, random_gbuffers, render_all

PROMPT = "a courtyard at noon, the sun on the left"
SUN = Light(sun_azimuth=-60.0, sun_elevation=35.0)


def _lit_model(refiner: str | None = None):
    model = bundle.make_random_flash(gbuffer_encoder="gbuffer-encoder-slim-lit", seed=0)
    if refiner:
        from stream_helpers import random_refiner

        model.refiner = random_refiner(refiner)
    return model


def _encode(encoder, chunks, lights):
    stage = pl.GBufferEncode(encoder, lights=lights)
    outs = [stage.step(c) for c in chunks] + [stage.flush()]
    return torch.cat([o.tensor for o in outs if o is not None], 2)


def test_the_sixth_plane_is_the_priors_image_with_the_shadow_pass_when_given():
    """with_prior appends the prior's shaded sRGB image as 8-bit; a stream's shadow pass replaces the screen-space
    shadows there (and changes the plane); the encoder's latents of a chunked stream equal the whole clip's."""
    g = random_gbuffers(9, 32, 32)
    light = pack(SUN).expand(9, -1)
    prior = ShadingPrior()
    planes = gbuffer_encoder.with_prior(prior, g.images, light)
    assert planes.shape == (9, 6, 32, 32, 3) and planes.dtype == torch.uint8
    assert torch.equal(planes[:, :5], g.images)
    want = prior(g.images, light)[:, :3].mul(255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    assert torch.equal(planes[:, 5], want)
    shadow = torch.from_numpy(moving_shadow(9, 32, 32, start=4, step=2, width=10))
    passed = gbuffer_encoder.with_prior(prior, g.images, light, sun_visibility=shadow.float() / 255)
    assert not torch.equal(passed[:, 5], planes[:, 5])

    encoder = _lit_model().gbuffer_encoder
    lights = LightSchedule.constant(SUN)
    whole = _encode(encoder, [GBuffers(g.images, shadow=shadow)], lights)
    chunked = _encode(encoder, [GBuffers(g.images[a:a + 3], shadow=shadow[a:a + 3]) for a in range(0, 9, 3)], lights)
    assert torch.equal(whole, chunked)
    assert torch.equal(whole, encoder.encode(passed))
    assert not torch.equal(whole, _encode(encoder, [g], lights))  # the pass reached the encoder


def test_a_light_changed_mid_stream_reaches_the_encoder_from_its_frame():
    """FlashPipeline.set_light on a model whose encoder reads the light (no refiner): the frames before the
    change keep the prompt's light, those after it the given one, exactly as a schedule that says so; the
    encoder and a light-reading refiner share it."""
    model = _lit_model()
    sched = PromptSchedule.encode(model.text_encoder(), PROMPT)
    g = random_gbuffers(13, 32, 32)
    pipe = pl.FlashPipeline(model, sched, seed=2)
    out = [pipe.step(GBuffers(g.images[:5]))]
    pipe.set_light(SUN, 7)
    out += [pipe.step(GBuffers(g.images[5:])), pipe.flush()]
    got = torch.cat([o for o in out if o is not None])
    lights = prompt_lights(model, sched).changed(7, pack(SUN)[0])
    assert torch.equal(got, render_all(pl.FlashPipeline(model, sched, seed=2, lights=lights), [g]))
    assert not torch.equal(got, render_all(pl.FlashPipeline(model, sched, seed=2), [g]))

    both = _lit_model("gbuffer-refiner-16-given")
    pipe = pl.FlashPipeline(both, sched, seed=2)
    pipe.step(GBuffers(g.images[:5]))
    pipe.set_light(SUN, 7)
    assert pipe.stage("encode").lights is pipe.refine.lights


def test_a_widened_student_renders_what_it_rendered_before():
    """lit_encoder + widen_inputs: the five-branch model's DiT given 16 zero input columns and its encoder a
    sixth branch (the tiny codec's RGB encoder) renders the five-branch model's frames, whatever the light."""
    from alaya_flash.training.light_reading import lit_encoder, widen_inputs

    five = bundle.make_random_flash(seed=4)
    wide = bundle.make_random_flash(seed=4)
    wide.gbuffer_encoder = lit_encoder(five.gbuffer_encoder, five.decoder.state_dict()).eval()
    wide.dit = widen_inputs(five.dit, 16).eval()
    assert wide.dit.config.in_dim == 112 and wide.gbuffer_encoder.config.reads_light
    rgb_branch = gbuffer_encoder.split_branches(wide.gbuffer_encoder.state_dict(), 6)[5]
    assert all(torch.equal(v, five.decoder.state_dict()[k]) for k, v in rgb_branch.items())
    sched = PromptSchedule.encode(five.text_encoder(), PROMPT)
    g = random_gbuffers(9, 32, 32)
    before = render_all(pl.FlashPipeline(five, sched, seed=1), [g])
    after = render_all(pl.FlashPipeline(wide, sched, seed=1, lights=LightSchedule.constant(SUN)), [g])
    torch.testing.assert_close(after, before, atol=2e-5, rtol=0)  # zero columns: only the matmul's blocking differs


def test_light_reading_bad_input_is_one_line(tmp_path):
    with pytest.raises(AlayaError, match="reads_light needs 6 branches"):
        gbuffer_encoder.GBufferEncoderConfig(branches=5, reads_light=True)
    with pytest.raises(AlayaError, match="this encoder reads the light; connect a light"):
        pl.GBufferEncode(_lit_model().gbuffer_encoder)
    with pytest.raises(AlayaError, match=r"9 frame\(s\) need one packed light each"):
        gbuffer_encoder.with_prior(ShadingPrior(), random_gbuffers(9).images, pack(SUN))
    folder = bundle.save_flash(_lit_model(), tmp_path / "lit")
    raw = json.loads((folder / "config.json").read_text())
    raw["networks"]["gbuffer_encoder"]["config"].update(branches=5, reads_light=False)
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError):  # the encoder's weights no longer match, or the DiT's input does not
        bundle.load_flash_folder(folder)
    raw["networks"]["gbuffer_encoder"]["config"]["reads_light"] = True  # a config that contradicts itself
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config.json: networks.gbuffer_encoder.config: .*reads_light needs 6"):
        bundle.load_flash_folder(folder)


def test_the_compiled_runtimes_encoder_graph_takes_the_six_planes():
    """The graph model_zoo/runtime converts for OpenVINO (graphs.EncoderGroup, one latent per call with its
    memory) computes a light-reading encoder's latents as the torch stream does (converting it costs over a
    minute here; the graph is what differs by branch count)."""
    from alaya_flash.model_zoo.runtime.graphs import EncoderGroup

    encoder = _lit_model().gbuffer_encoder
    planes = gbuffer_encoder.with_prior(ShadingPrior(), random_gbuffers(5, 32, 32).images, pack(SUN).expand(5, -1))
    group = EncoderGroup(encoder)
    memory = [torch.zeros(s) for s in EncoderGroup.memory_shapes_for(encoder, 32, 32)]
    z0, *memory = group(planes[:1].expand(4, -1, -1, -1, -1), *memory)  # frame 0 alone makes latent 0
    z1, *_ = group(planes[1:5], *memory)
    torch.testing.assert_close(torch.stack([z0[0], z1[0]], 1)[None], encoder.encode(planes), atol=1e-5, rtol=1e-5)


def test_the_refiner_reuses_the_encoders_prior_and_renders_the_same_frames():
    """With a light-reading encoder and refiner, the prior runs once a frame (SharedPrior): the frames equal a
    pipeline whose refiner shades again, chunked, with a shadow pass, and with the light changed mid-stream
    both ahead of the encoder and behind it (frames the encoder has taken: the refiner shades those again)."""
    model = _lit_model("gbuffer-refiner-16-given")
    sched = PromptSchedule.encode(model.text_encoder(), PROMPT)
    g = random_gbuffers(17, 32, 32)
    shadow = torch.from_numpy(moving_shadow(17, 32, 32, start=2, step=1, width=8))

    def render(share: bool, change_at: int):
        pipe = pl.FlashPipeline(model, sched, seed=2)
        if not share:
            pipe.stage("encode").share = pipe.refine.share = None
        out = [pipe.step(GBuffers(g.images[:5], shadow=shadow[:5]))]
        pipe.set_light(SUN, change_at)
        out += [pipe.step(GBuffers(g.images[a:a + 4], shadow=shadow[a:a + 4])) for a in range(5, 17, 4)]
        out.append(pipe.flush())
        return torch.cat([o for o in out if o is not None])

    for change_at in (7, 3):
        assert torch.equal(render(True, change_at), render(False, change_at)), change_at
    counted = []
    real = model.refiner.shading_prior.forward
    model.refiner.shading_prior.forward = lambda *a, **k: counted.append(1) or real(*a, **k)
    try:
        render(True, 7)
    finally:
        model.refiner.shading_prior.forward = real
    assert not counted  # the refiner shaded nothing itself


def test_a_refiner_whose_prior_reflects_shades_its_own():
    """A refiner whose prior has screen-space reflections (`gbuffer-refiner-16-mirror`) shades differently from
    the encoder's plain prior, so nothing is shared: the refiner shades every frame itself. Its config needs the
    prior."""
    from alaya_flash.model_zoo.codecs.refiner import RefinerConfig

    model = _lit_model("gbuffer-refiner-16-mirror")
    assert model.refiner.shading_prior.config.reflections
    pipe = pl.FlashPipeline(model, PromptSchedule.encode(model.text_encoder(), PROMPT), seed=2)
    assert pipe.stage("encode").share is None and pipe.refine.share is None
    counted = []
    real = model.refiner.shading_prior.forward
    model.refiner.shading_prior.forward = lambda *a, **k: counted.append(1) or real(*a, **k)
    try:
        g = random_gbuffers(9, 32, 32)
        frames = [pipe.step(GBuffers(g.images)), pipe.flush()]
    finally:
        model.refiner.shading_prior.forward = real
    assert sum(len(f) for f in frames if f is not None) == 9 and counted
    with pytest.raises(AlayaError, match="reflections needs prior"):
        RefinerConfig(reflections=True)
