"""Light from the user, everywhere a user renders: `render/run --light`, the Refine and Render G-Buffer
Stream nodes' light input, and a stream's light changed mid-stream (what the live page and engines use).
The frames under a given light equal the Flash pipeline's with that LightSchedule."""
from pathlib import Path

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle, folders
from alaya_flash.model_zoo.codecs import refiner as rf
from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.model_zoo.light import Light, pack
from alaya_flash.model_zoo.precision import choose_dtype
from alaya_flash.streaming.cli import main
from alaya_flash.streaming.files.sinks import to_uint8
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.render.lighting import LightNotRead, LightSchedule, prompt_lights, user_lights
from alaya_flash.streaming.values import GBuffers, PromptSchedule
from stream_helpers import random_gbuffers, render_all

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a sunny street, the sun on the left"
MOVING = "0: bright_sunny,az=90,el=30\n6: sunset_dramatic,az=-90,el=10"


def _random_refiner(name: str, seed: int = 3) -> rf.GBufferRefiner:
    """A refiner of config `name` with every weight random (a fresh one's last layers are zero: the identity)."""
    net = rf.build(rf.CONFIGS[name])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return net


def _model(refiner: str | None = "gbuffer-refiner-16-light"):
    model = bundle.make_random_flash(seed=0)
    model.refiner = None if refiner is None else _random_refiner(refiner)
    return model


@pytest.fixture(scope="module")
def light_folder(tmp_path_factory):
    return bundle.save_flash(_model(), tmp_path_factory.mktemp("models") / "light")


@pytest.fixture(scope="module")
def prompt_folder(tmp_path_factory):
    return bundle.save_flash(_model("gbuffer-refiner-16-prompt"), tmp_path_factory.mktemp("models") / "prompt")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    out = tmp_path_factory.mktemp("clip") / "clip"
    write_stream(synthetic_stream(32, 32, 9, seed=1), NpyWindowSink(out, window=16))
    return out


def _clip_gbuffers(clip) -> torch.Tensor:
    return torch.from_numpy(np.load(clip / "window-0000.npy"))


def _pipeline_frames(folder, clip, lights) -> np.ndarray:
    """What FlashPipeline renders from the clip with the folder's model (loaded as `render` loads it) and `lights`."""
    model = folders.load_flash(folder, "cpu", choose_dtype("auto", torch.device("cpu")))
    prompts = PromptSchedule.encode(model.text_encoder(), PROMPT)
    return to_uint8(render_all(pl.FlashPipeline(model, prompts, seed=0, lights=lights), [GBuffers(_clip_gbuffers(clip))]))


def _rendered(out: Path) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(Image.open(p).convert("RGB")) for p in sorted(out.glob("*.png"))])


def _render(clip, folder, out, *extra):
    return main(["--quiet", "render", str(clip), "--model", str(folder), "--prompt", PROMPT, "--format", "png",
                 "--out", str(out), *extra])


def test_render_light_gives_the_pipelines_frames_under_that_light(clip, light_folder, tmp_path):
    """`render --light X` = FlashPipeline(lights=LightSchedule.parse(X)); without --light = the prompt's light
    (the light head's reading), and the two differ."""
    assert _render(clip, light_folder, tmp_path / "moving", "--light", MOVING) == 0
    moving = _rendered(tmp_path / "moving")
    assert moving.shape == (9, 32, 32, 3)
    assert np.array_equal(moving, _pipeline_frames(light_folder, clip, user_lights(MOVING)))
    assert _render(clip, light_folder, tmp_path / "prompt") == 0
    from_prompt = _rendered(tmp_path / "prompt")
    assert np.array_equal(from_prompt, _pipeline_frames(light_folder, clip, None))
    assert np.abs(from_prompt.astype(int) - moving).max() > 2


def test_run_light_feeds_every_light_input(clip, light_folder, tmp_path):
    """`run --light` on the separate-node workflow and on Render G-Buffer Stream gives render --light's frames."""
    want = _pipeline_frames(light_folder, clip, user_lights("az=-60,el=15"))
    sets = ["--set", f"Load Flash Model.model={light_folder}"]
    assert main(["--quiet", "run", str(ROOT / "workflows/api/render-gbuffer-sequence.json"), "--light", "az=-60,el=15",
                 *sets, "--set", f"Load G-Buffers.path={clip}", "--set", f"Save.filename={tmp_path / 'a'}",
                 "--set", "Save.format=png", "--set", "Encode Prompt.text=" + PROMPT]) == 0
    assert np.array_equal(_rendered(tmp_path / "a"), want)
    assert main(["--quiet", "run", str(ROOT / "workflows/api/render-long-clip.json"), "--light", "az=-60,el=15",
                 *sets, "--set", f"Render G-Buffer Stream.path={clip}", "--set", "Render G-Buffer Stream.chunk=4",
                 "--set", f"Render G-Buffer Stream.filename={tmp_path / 'b'}", "--set", "Render G-Buffer Stream.format=png",
                 "--set", "Encode Prompt.text=" + PROMPT]) == 0
    assert np.array_equal(_rendered(tmp_path / "b"), want)


def test_a_light_the_model_does_not_read_is_one_line_naming_the_flag(clip, prompt_folder, light_folder, tmp_path,
                                                                      capsys):
    assert _render(clip, prompt_folder, tmp_path / "a", "--light", "az=90") == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"alaya-flash: error: --light: Flash model ({prompt_folder}, RANDOM weights) does not read a light "
                   "(its refiner is not light-reading)"), err
    assert not (tmp_path / "a").exists()
    assert main(["--quiet", "run", str(ROOT / "workflows/api/render-gbuffer-sequence.json"), "--light", "az=90",
                 "--set", f"Load Flash Model.model={prompt_folder}", "--set", f"Load G-Buffers.path={clip}",
                 "--set", f"Save.filename={tmp_path / 'b.mp4'}"]) == 2
    assert "--light: Flash model" in capsys.readouterr().err and not (tmp_path / "b.mp4").exists()
    for light, said in (("az=90,el=95", "--light: sun_elevation 95.0 is outside [-90, 90]"),
                        ("az=90,colour=1", "--light: unknown light key 'colour'"),
                        ("el=nan", "--light: sun_elevation must be a finite number, got nan")):
        assert _render(clip, light_folder, tmp_path / "c", "--light", light) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"alaya-flash: error: {said}") and "\n" not in err, err
    assert not (tmp_path / "c").exists()


def test_refine_node_light_input_in_both_runtimes(clip):
    """The Refine node with a Light node connected: ComfyUI's whole-sequence run equals the runner's chunked
    run; a model that does not read the light refuses it naming the node and the model."""
    import json

    from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
    from alaya_flash.nodes.models import RefinerHandle
    from alaya_flash.streaming.render import runner as rn
    from alaya_flash.streaming.render import workflow as wfm
    from stream_helpers import Collect

    classes = {**NODES, "Collect": Collect}
    graph = json.loads((ROOT / "workflows/api/render-gbuffer-sequence.json").read_text())
    graph["1"]["inputs"].update(path=str(clip), chunk=4)
    graph["2"]["inputs"].update(model="random:tiny", precision="fp32")
    graph["8"] = {"class_type": "Collect", "inputs": {"images": ["7", 0]}}
    model = _model()
    real = bundle.make_random_flash
    bundle.make_random_flash = lambda *a, **k: model
    try:
        runs = []
        for runner in (lambda wf, c: rn.StreamRunner(wf, c).run(), rn.execute_whole):
            wf = wfm.parse_workflow(graph, classes)
            wfm.feed_light(wf, MOVING, classes)
            Collect.got.clear()
            runner(wf, classes)
            runs.append(torch.cat(Collect.got))
    finally:
        bundle.make_random_flash = real
    assert runs[0].shape == (9, 32, 32, 3) and torch.equal(runs[0], runs[1])
    refine = NODES["AlayaFlash_Refine"]()
    sched = PromptSchedule.encode(model.text_encoder(), PROMPT)
    plain = _model("gbuffer-refiner-16-prompt")
    with pytest.raises(LightNotRead, match="Refine with G-Buffers: light: Flash model \\(in memory, RANDOM weights\\) "
                                           "does not read a light \\(its refiner is not light-reading\\)"):
        refine.start_stream(RefinerHandle(plain.refiner, plain), sched, user_lights("az=0"))
    with pytest.raises(LightNotRead, match="does not read a light \\(it has no G-buffer refiner\\)"):
        refine.start_stream(RefinerHandle(None, plain), sched, user_lights("az=0"))
    with pytest.raises(AlayaError, match="light must come from a Light node, got str"):
        refine.start_stream(RefinerHandle(model.refiner, model), sched, "az=0")


def test_changed_switches_the_light_at_a_frame_and_keeps_only_what_is_ahead():
    sched = user_lights(MOVING)
    sun = pack(Light(sun_azimuth=10.0, sun_elevation=60.0))[0]
    later = sched.changed(4, sun, since=2)
    frames = torch.arange(2, 12)
    want = torch.where((frames < 4)[:, None], sched.at(frames), sun.expand(len(frames), -1))
    assert torch.allclose(later.at(frames), want)
    assert [f for f, _ in later.keys] == [2, 3, 4]
    assert [f for f, _ in LightSchedule.constant(Light()).changed(0, sun).keys] == [0]


def test_a_light_changed_mid_stream_reaches_the_refiner_from_its_frame():
    """FlashPipeline.set_light(light, frame) mid-stream: every frame before `frame` keeps the prompt's light,
    every one from it the new one (the refiner applied afterwards with those per-frame lights); None goes
    back to the prompt's."""
    model = _model()
    sched = PromptSchedule.encode(model.text_encoder(), PROMPT)
    g = random_gbuffers(13, 32, 32)
    plain = render_all(pl.FlashPipeline(model, sched, seed=2, refine=False), [g])
    pipe = pl.FlashPipeline(model, sched, seed=2)
    sun = Light(sun_azimuth=-90.0, sun_elevation=20.0)
    out = [pipe.step(GBuffers(g.images[:5]))]
    pipe.set_light(sun, 7)
    out += [pipe.step(GBuffers(g.images[5:9]))]
    pipe.set_light(None, 11)
    out += [pipe.step(GBuffers(g.images[9:])), pipe.flush()]
    got = torch.cat([o for o in out if o is not None])
    prompt = prompt_lights(model, sched).at(torch.arange(13))
    lights = prompt.clone()
    lights[7:11] = pack(sun)[0]
    text = sched.at(0)[1][:, 0].expand(13, -1)
    assert torch.equal(got, model.refiner.refine(plain, g.images, text, lights))
    unlit = pl.FlashPipeline(_model("gbuffer-refiner-16-prompt"), sched)
    with pytest.raises(LightNotRead, match="light: Flash model .* does not read a light"):
        unlit.set_light(sun, 0)
