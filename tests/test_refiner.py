"""The G-buffer refiner: the network, its place in the Flash pipeline (each frame refined with its
own G-buffers, whatever the chunking), model folders with and without it, and the Refine node."""
import json

import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.model_zoo.codecs import refiner as rf
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError
from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.values import GBuffers, PromptSchedule
from alaya_flash.streaming.render import runner as rn
from alaya_flash.streaming.render import workflow as wfm
from stream_helpers import Collect
from stream_helpers import random_gbuffers as _gbuffers
from stream_helpers import random_refiner
from stream_helpers import render_all as _render


def _perturbed(refiner: rf.GBufferRefiner, seed: int = 1) -> rf.GBufferRefiner:
    """A refiner that is not the identity (a fresh one's last layer is zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in (refiner.tail[-1], *([refiner.text[-1]] if refiner.text_dim else [])):
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return refiner


@pytest.fixture(scope="module")
def flash():
    model = bundle.make_random_flash(seed=0, refiner="gbuffer-refiner-16")
    _perturbed(model.refiner)
    return model


@pytest.fixture(scope="module")
def prompts(flash):
    return PromptSchedule.encode(flash.text_encoder(), "a sunny street")


def test_a_fresh_refiner_is_the_identity_and_a_trained_one_is_not():
    net = rf.build(rf.CONFIGS["gbuffer-refiner-16"])
    frames = torch.rand(3, 16, 24, 3)
    gb = _gbuffers(3, 16, 24).images
    assert torch.equal(net.refine(frames, gb), frames)
    out = _perturbed(net).refine(frames, gb)
    assert out.shape == frames.shape and not torch.allclose(out, frames, atol=1e-3)
    assert 0 <= out.min() and out.max() <= 1


def test_gbuffer_planes_take_each_pass_in_order():
    images = torch.zeros(1, 5, 2, 2, 3, dtype=torch.uint8)
    for m in range(5):
        images[0, m] = torch.tensor([10 * m + 1, 10 * m + 2, 10 * m + 3], dtype=torch.uint8)
    planes = rf.gbuffer_planes(images)[0, :, 0, 0] * 255
    # albedo RGB, depth, metallic, normal XYZ, roughness (one channel of each single-channel pass)
    assert planes.round().tolist() == [1, 2, 3, 11, 21, 31, 32, 33, 41]
    with pytest.raises(AlayaError, match="expected uint8 G-buffers"):
        rf.gbuffer_planes(images.float())


def test_refine_refuses_frames_and_gbuffers_that_do_not_match():
    net = rf.build(rf.CONFIGS["gbuffer-refiner-16"])
    with pytest.raises(AlayaError, match="differ in count or size"):
        net.refine(torch.rand(2, 16, 16, 3), _gbuffers(3).images)


@pytest.mark.parametrize("n, cut", [(5, 1), (13, 3), (16, 16)])
def test_each_frame_is_refined_with_its_own_gbuffers_whatever_the_chunking(flash, prompts, n, cut):
    """The pipeline with the refiner equals the refiner applied afterwards to the unrefined stream's
    frames with the whole clip's G-buffers: frames and G-buffers pair in order although the decoder
    lags its input. float32, so streaming equals batch exactly."""
    g = _gbuffers(n)
    pieces = [GBuffers(g.images[i:i + cut]) for i in range(0, n, cut)]
    refined = _render(pl.FlashPipeline(flash, prompts, seed=2), pieces)
    plain = _render(pl.FlashPipeline(flash, prompts, seed=2, refine=False), [g])
    assert refined.shape == plain.shape == (n, 16, 16, 3)
    assert torch.equal(refined, flash.refiner.refine(plain, g.images))
    assert not torch.allclose(refined, plain, atol=1e-3)


def test_the_pipeline_times_the_refine_stage(flash, prompts):
    pipe = pl.FlashPipeline(flash, prompts)
    _render(pipe, [_gbuffers(5)])
    assert pipe.seconds["refine"] > 0
    assert "refine" not in pl.FlashPipeline(flash, prompts, refine=False).seconds


def test_refine_stage_pairs_in_order_and_refuses_leftovers():
    class Albedo:  # a stand-in refiner whose output is the albedo pass: shows which G-buffer each frame got
        def refine(self, frames, gbuffers, text=None, light=None, depth_near=None):
            return gbuffers[:, 0].float() / 255

    g = _gbuffers(6)
    stage = pl.Refine(Albedo())
    stage.add_gbuffers(GBuffers(g.images[:4]))
    a = stage.step(torch.zeros(1, 16, 16, 3))
    assert stage.step(None) is None  # no frame waits for its G-buffers
    stage.add_gbuffers(GBuffers(g.images[4:]))
    b = stage.step(torch.zeros(5, 16, 16, 3))
    assert torch.equal(torch.cat([a, b]), g.images[:, 0].float() / 255)
    stage.flush()
    stage.add_gbuffers(GBuffers(g.images[:2]))
    stage.step(torch.zeros(1, 16, 16, 3))
    with pytest.raises(AlayaError, match="0 frame\\(s\\) and 1 G-buffer frame\\(s\\) left unpaired"):
        stage.flush()


def test_folder_round_trip_with_and_without_the_refiner(flash, tmp_path):
    bundle.save_flash(flash, tmp_path / "m")
    back = bundle.load_flash_folder(tmp_path / "m", dtype=torch.float32)
    assert back.refiner is not None
    for k, v in flash.refiner.state_dict().items():
        assert torch.equal(back.refiner.state_dict()[k], v), k
    plain = bundle.make_random_flash(seed=0)
    bundle.save_flash(plain, tmp_path / "m")  # saved again without one: no stale refiner file is left
    assert not (tmp_path / "m" / "refiner.safetensors").exists()
    assert bundle.load_flash_folder(tmp_path / "m").refiner is None


def test_refiner_folder_errors_name_file_and_key(flash, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = bundle.save_flash(flash, tmp_path / "m")
    weights = folder / "refiner.safetensors"
    state = load_file(weights)
    state["tail.2.weight"] = state["tail.2.weight"][:2]
    save_file(state, weights)
    with pytest.raises(CheckpointError, match="refiner.safetensors.*tail.2.weight"):
        bundle.load_flash_folder(folder)
    weights.unlink()
    with pytest.raises(CheckpointError, match="refiner.safetensors: missing"):
        bundle.load_flash_folder(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["networks"]["upscaler"] = cfg["networks"].pop("refiner")
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="networks upscaler are unknown"):
        bundle.load_flash_folder(folder)




def test_a_prompt_refiner_starts_as_the_identity_and_then_follows_the_prompt():
    frames, gb = torch.rand(2, 16, 24, 3), _gbuffers(2, 16, 24).images
    a, b = torch.randn(2, 384).unbind()
    fresh = rf.build(rf.CONFIGS["gbuffer-refiner-16-prompt"])
    assert torch.equal(fresh.refine(frames, gb, a.expand(2, -1)), frames)
    net = random_refiner("gbuffer-refiner-16-prompt")
    out_a, out_b = net.refine(frames, gb, a.expand(2, -1)), net.refine(frames, gb, b.expand(2, -1))
    assert not torch.allclose(out_a, out_b, atol=1e-3)
    mixed = net.refine(frames, gb, torch.stack([a, b]))  # each frame its own prompt
    assert torch.equal(mixed[0], out_a[0]) and torch.equal(mixed[1], out_b[1])
    with pytest.raises(AlayaError, match="reads the prompt: it needs one embedding per frame \\(2\\), got None"):
        net.refine(frames, gb)
    with pytest.raises(AlayaError, match="reads a prompt embedding \\(1, 384\\), got \\(1, 32\\)"):
        net(frames[:1].permute(0, 3, 1, 2), rf.gbuffer_planes(gb[:1]), torch.zeros(1, 32))


def test_the_context_path_reaches_across_the_frame_and_reads_the_prompt():
    """A change 80 pixels away moves a pixel's refined colour only through the 1/16-resolution context
    path, whose own FiLM follows the prompt; a fresh context refiner is still the identity."""
    frames, gb = torch.rand(1, 128, 128, 3), _gbuffers(1, 128, 128).images
    far = gb.clone()
    far[:, :, 100:, 100:] = 255 - far[:, :, 100:, 100:]  # the G-buffers of the far corner turned over
    a, b = torch.randn(2, 384).unbind()
    fresh = rf.build(rf.CONFIGS["gbuffer-refiner-16-context"])
    assert torch.equal(fresh.refine(frames, gb, a[None]), frames)
    rgb = frames.permute(0, 3, 1, 2)
    for name, reaches in (("gbuffer-refiner-16-prompt", False), ("gbuffer-refiner-16-context", True)):
        net = random_refiner(name)
        with torch.no_grad():  # (unclamped)
            near, moved = (net(rgb, rf.gbuffer_planes(x), a[None])[0, :, :16, :16] for x in (gb, far))
        assert ((moved - near).abs().max() > 1e-4) == reaches, name
    net = random_refiner("gbuffer-refiner-16-context")
    with torch.no_grad():
        net.text[-1].weight.zero_()  # only the context path reads the prompt now
        net.text[-1].bias.zero_()
    assert not torch.allclose(net.refine(frames, gb, a[None]), net.refine(frames, gb, b[None]), atol=1e-3)


def test_a_context_refiner_in_bf16_with_fused_ops_matches_float32():
    """bf16 inference runs the fused, channels-last path (one frame per call, as refine streams)."""
    net = random_refiner("gbuffer-refiner-16-context")
    rgb, planes, text = torch.rand(1, 3, 64, 96), rf.gbuffer_planes(_gbuffers(1, 64, 96).images), torch.randn(1, 384)
    with torch.no_grad():
        want = net(rgb, planes, text) - rgb  # (unclamped residuals)
        got = net.to(torch.bfloat16)(rgb, planes, text) - rgb
    assert (got - want).abs().max() < 0.03 * want.abs().max()


@pytest.mark.parametrize("cut", [1, 3, 13])
def test_a_prompt_schedule_reaches_the_refiner_frame_by_frame(flash, cut):
    """A refiner that reads the prompt gets, for each frame, the embedding in effect at that frame,
    whatever the chunking: the pipeline's frames equal the refiner applied afterwards with them."""
    model = bundle.make_random_flash(seed=0)
    model.refiner = random_refiner("gbuffer-refiner-16-prompt")
    sched = PromptSchedule.encode(model.text_encoder(), "0: a sunny street\n6: a street at night")
    g = _gbuffers(13)
    pieces = [GBuffers(g.images[i:i + cut]) for i in range(0, 13, cut)]
    refined = _render(pl.FlashPipeline(model, sched, seed=2), pieces)
    plain = _render(pl.FlashPipeline(model, sched, seed=2, refine=False), [g])
    per_frame = torch.cat([sched.at(f)[1][:, 0] for f in range(13)])
    assert torch.equal(refined, model.refiner.refine(plain, g.images, per_frame))
    day = sched.at(0)[1][:, 0].expand(13, -1)
    assert not torch.allclose(refined[6:], model.refiner.refine(plain, g.images, day)[6:], atol=1e-3)


def test_a_prompt_refiner_without_a_prompt_is_refused_by_name(flash, tmp_path):
    net = random_refiner("gbuffer-refiner-16-prompt")
    with pytest.raises(AlayaError, match="reads the prompt; connect the prompt"):
        pl.Refine(net)
    with pytest.raises(AlayaError, match="prompt embeddings are 8 wide, the refiner reads 384"):
        pl.Refine(net, PromptSchedule.constant(torch.zeros(1, 1, 8)))
    from alaya_flash.nodes.models import RefinerHandle

    with pytest.raises(AlayaError, match="Refine with G-Buffers: .* connect the 'prompt' input"):
        NODES["AlayaFlash_Refine"]().start_stream(RefinerHandle(net))
    # a folder whose refiner reads prompts of another width than its DiT's is refused on load
    model = bundle.make_random_flash(seed=0)
    model.refiner = rf.build(rf.RefinerConfig(text_dim=32))
    folder = bundle.save_flash(model, tmp_path / "m")
    with pytest.raises(CheckpointError, match="refiner reads 32-wide prompt embeddings, the DiT 384-wide"):
        bundle.load_flash_folder(folder)


def test_prompt_refiner_folder_round_trip(tmp_path):
    model = bundle.make_random_flash(seed=0, refiner="gbuffer-refiner-16-prompt")
    assert model.refiner.text_dim == 384
    model.refiner = random_refiner("gbuffer-refiner-16-prompt")
    back = bundle.load_flash_folder(bundle.save_flash(model, tmp_path / "m"), dtype=torch.float32)
    assert back.refiner.config == model.refiner.config
    for k, v in model.refiner.state_dict().items():
        assert torch.equal(back.refiner.state_dict()[k], v), k


def _graph(clip, refine_input="7"):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    g = json.loads((root / "workflows" / "api" / "render-gbuffer-sequence.json").read_text())
    g["1"]["inputs"].update(path=str(clip), frames=10, chunk=3)
    g["2"]["inputs"].update(model="random:tiny", precision="fp32", device="cpu")
    g["8"] = {"class_type": "Collect", "inputs": {"images": [refine_input, 0]}}
    return g


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    out = tmp_path_factory.mktemp("clip") / "clip"
    write_stream(synthetic_stream(32, 32, 10), NpyWindowSink(out, window=16))
    return out


def test_refine_node_refines_in_both_runtimes_and_passes_through_without_a_refiner(clip, monkeypatch):
    """The Refine node with a model's refiner: the workflow run chunk by chunk equals the whole-sequence
    run (ComfyUI's way) and differs from Decode's frames; a model without a refiner passes them through."""
    classes = {**NODES, "Collect": Collect}
    real = bundle.make_random_flash

    def with_perturbed_refiner(*args, **kwargs):
        model = real(*args, **kwargs)
        if model.refiner is not None:
            _perturbed(model.refiner)
        return model

    monkeypatch.setattr(bundle, "make_random_flash", with_perturbed_refiner)

    def frames(graph, runner):
        Collect.got.clear()
        runner(wfm.parse_workflow(graph, classes), classes)
        return torch.cat(Collect.got)

    chunked = frames(_graph(clip), lambda wf, c: rn.StreamRunner(wf, c).run())
    whole = frames(_graph(clip), rn.execute_whole)
    decoded = frames(_graph(clip, refine_input="6"), lambda wf, c: rn.StreamRunner(wf, c).run())
    assert chunked.shape == (10, 32, 32, 3) and torch.equal(chunked, whole)
    assert not torch.allclose(chunked, decoded, atol=1e-3)
    monkeypatch.setattr(bundle, "make_random_flash", lambda *a, **k: real(*a, **{**k, "refiner": None}))
    assert torch.equal(frames(_graph(clip), lambda wf, c: rn.StreamRunner(wf, c).run()), decoded)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_refiner_on_cuda_gives_the_cpus_frames_back_on_the_cpu():
    net = _perturbed(rf.build(rf.CONFIGS["gbuffer-refiner-16"]))
    frames, gb = torch.rand(3, 32, 48, 3), _gbuffers(3, 32, 48).images
    cpu = net.refine(frames, gb)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        gpu = net.cuda().refine(frames, gb)
    assert gpu.device.type == "cpu" and (gpu - cpu).abs().max() <= 1e-4


def _sun(azimuth: float, n: int = 1) -> torch.Tensor:
    from alaya_flash.model_zoo.light import Light, pack

    return pack(Light(sun_azimuth=azimuth, sun_elevation=30.0)).expand(n, -1)


def test_a_light_refiner_starts_as_the_identity_and_then_follows_the_light():
    """The light refiner reads the shading prior under each frame's light: a fresh one returns its
    input; a trained one renders another sun differently, and a frame under its own light alike
    whatever the other frames' lights are (frame by frame)."""
    frames, gb = torch.rand(2, 32, 32, 3), _gbuffers(2, 32, 32).images
    text = torch.randn(1, 384).expand(2, -1)
    fresh = rf.build(rf.CONFIGS["gbuffer-refiner-16-light"])
    assert fresh.reads_light and not rf.build(rf.CONFIGS["gbuffer-refiner-16-context"]).reads_light
    assert torch.equal(fresh.refine(frames, gb, text, _sun(90.0, 2)), frames)
    net = random_refiner("gbuffer-refiner-16-light")
    left, right = net.refine(frames, gb, text, _sun(90.0, 2)), net.refine(frames, gb, text, _sun(-90.0, 2))
    assert not torch.allclose(left, right, atol=1e-3)
    mixed = net.refine(frames, gb, text, torch.cat([_sun(90.0), _sun(-90.0)]))
    assert torch.equal(mixed[0], left[0]) and torch.equal(mixed[1], right[1])
    with pytest.raises(AlayaError, match="reads the light: it needs one light per frame"):
        net.refine(frames, gb, text)
    with pytest.raises(AlayaError, match="reads the shading prior"):
        net(frames.permute(0, 3, 1, 2), rf.gbuffer_planes(gb), text)
    # the prior has no weights: the checkpoint holds the network's alone
    assert not any(k.startswith("shading_prior") for k in net.state_dict())


def test_a_blending_refiner_mixes_the_prior_in_by_the_weight_it_predicts():
    """The blend config's fourth output is the prior's share: fresh, it returns its input; with only that
    weight's bias at 1 it returns the shading prior's own frame; at 0.25 a quarter of the way there."""
    from alaya_flash.model_zoo.shading_prior import ShadingPrior

    frames, gb = torch.rand(2, 32, 32, 3), _gbuffers(2, 32, 32).images
    text, light = torch.randn(1, 384).expand(2, -1), _sun(60.0, 2)
    net = rf.build(rf.CONFIGS["gbuffer-refiner-16-blend"])
    assert net.reads_light and tuple(net.tail[-1].weight.shape[:1]) == (4,)
    assert torch.equal(net.refine(frames, gb, text, light), frames)
    shaded = ShadingPrior()(gb, light, 0.5)[:, :3].permute(0, 2, 3, 1)
    for share in (1.0, 0.25):
        with torch.no_grad():
            net.tail[-1].bias[3] = share
        want = (frames + share * (shaded - frames)).clamp(0, 1)
        assert (net.refine(frames, gb, text, light) - want).abs().max() < 1e-5
    with pytest.raises(AlayaError, match="blend needs prior"):
        rf.RefinerConfig(blend=True)


def test_a_refiner_that_reads_whether_light_and_shadows_were_given():
    """The given config reads two more constant planes: fresh it is still the identity; trained (random
    weights) its frames change with each flag; refine() sets the shadow flag from a shadow pass and the
    light flag from light_given (default: given); forward without the flags is one line."""
    from stream_helpers import random_refiner

    frames, gb = torch.rand(2, 32, 32, 3), _gbuffers(2, 32, 32).images
    text, light = torch.randn(1, 384).expand(2, -1), _sun(60.0, 2)
    fresh = rf.build(rf.CONFIGS["gbuffer-refiner-16-given"])
    assert fresh.reads_given and tuple(fresh.head[0].weight.shape[:2]) == (16, 19)
    assert torch.equal(fresh.refine(frames, gb, text, light, light_given=False), frames)
    net = random_refiner("gbuffer-refiner-16-given")
    vis = torch.ones(2, 32, 32)  # a shadow pass that shadows nothing: the prior's planes barely move
    given = net.refine(frames, gb, text, light)
    assert torch.equal(given, net.refine(frames, gb, text, light, light_given=torch.tensor([True, True])))
    assert not torch.allclose(given, net.refine(frames, gb, text, light, light_given=False))
    assert not torch.allclose(net.refine(frames, gb, text, light, sun_visibility=vis),
                              net.refine(frames, gb, text, light, sun_visibility=vis, light_given=False))
    rgb, planes = frames.permute(0, 3, 1, 2), rf.gbuffer_planes(gb)
    prior = torch.rand(2, 5, 32, 32)
    with pytest.raises(AlayaError, match=r"reads whether the light and shadows were given \(2, 2\), got None"):
        net(rgb, planes, text, prior)
    with pytest.raises(AlayaError, match="given needs prior"):
        rf.RefinerConfig(given=True)


@pytest.mark.parametrize("cut", [1, 5])
def test_a_light_schedule_reaches_the_refiner_frame_by_frame(cut):
    """Streamed in any chunking, the pipeline's frames equal the refiner applied afterwards with each
    frame's light from the schedule (the sun moving mid-stream); without an explicit light the
    prompt's light (the light head's reading) is used, and an explicit one wins over it."""
    from alaya_flash.streaming.render.lighting import LightSchedule, prompt_lights

    model = bundle.make_random_flash(seed=0)
    model.refiner = random_refiner("gbuffer-refiner-16-light")
    sched = pl.PromptSchedule.encode(model.text_encoder(), "a sunny street, the sun on the left")
    lights = LightSchedule.parse("0: az=90,el=30\n8: az=-90,el=30")
    g = _gbuffers(9, 32, 32)
    pieces = [pl.GBuffers(g.images[i:i + cut]) for i in range(0, 9, cut)]
    refined = _render(pl.FlashPipeline(model, sched, seed=2, lights=lights), pieces)
    plain = _render(pl.FlashPipeline(model, sched, seed=2, refine=False), [g])
    text = sched.at(0)[1][:, 0].expand(9, -1)
    assert torch.equal(refined, model.refiner.refine(plain, g.images, text, lights.at(torch.arange(9))))
    from_prompt = _render(pl.FlashPipeline(model, sched, seed=2), [g])
    assert torch.equal(from_prompt, model.refiner.refine(plain, g.images, text,
                                                         prompt_lights(model, sched).at(torch.arange(9))))
    assert not torch.allclose(from_prompt, refined, atol=1e-3)
    with pytest.raises(AlayaError, match="reads the light; connect a light"):
        pl.Refine(model.refiner, sched)


def test_light_refiner_folder_round_trip(tmp_path):
    model = bundle.make_random_flash(seed=0)
    model.refiner = random_refiner("gbuffer-refiner-16-light")
    back = bundle.load_flash_folder(bundle.save_flash(model, tmp_path / "m"), dtype=torch.float32)
    assert back.refiner.config == model.refiner.config and back.refiner.reads_light
    for k, v in model.refiner.state_dict().items():
        assert torch.equal(back.refiner.state_dict()[k], v)
