"""Light from the user, everywhere a user renders: `render/run --light`, the Refine and Render G-Buffer
Stream nodes' light input, and a stream's light changed mid-stream (what the live page and engines use).
The frames under a given light equal the Flash pipeline's with that LightSchedule."""
from pathlib import Path

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle, folders
from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.model_zoo.light import Light, pack
from alaya_flash.model_zoo.precision import choose_dtype
from alaya_flash.streaming.cli import main
from alaya_flash.streaming.files.sinks import to_uint8
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.render.lighting import LightNotRead, LightSchedule, prompt_lights, user_lights
from alaya_flash.streaming.values import GBuffers, PromptSchedule
from stream_helpers import random_gbuffers, random_refiner, render_all

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a sunny street, the sun on the left"
MOVING = "0: bright_sunny,az=90,el=30\n6: sunset_dramatic,az=-90,el=10"




def _model(refiner: str | None = "gbuffer-refiner-16-light"):
    model = bundle.make_random_flash(seed=0)
    model.refiner = None if refiner is None else random_refiner(refiner)
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


def test_a_schedule_knows_from_which_frame_its_light_was_given_or_the_prompts():
    """given_at: a user's or an engine's light is given, the light head's reading of the prompt is not; changed()
    switches the flag at its frame, and a light changed every frame keeps only the flags still ahead."""
    sun = pack(Light(sun_azimuth=10.0, sun_elevation=60.0))[0]
    assert user_lights(MOVING).given_at(torch.arange(12)).all()
    prompt = LightSchedule([(0, sun)], given=[(0, False)])
    mixed = prompt.changed(4, sun, since=2).changed(9, sun, since=3, given=False)
    assert mixed.given_at(torch.arange(3, 12)).tolist() == [False] + [True] * 5 + [False] * 3
    live = LightSchedule.constant(Light())
    for frame in range(1, 200):
        live = live.changed(frame, sun, since=frame - 1, given=frame % 2 == 0)
    assert len(live.given) <= 3 and live.given_at(torch.tensor([198, 199])).tolist() == [True, False]


@pytest.mark.parametrize("config", ["gbuffer-refiner-16-light", "gbuffer-refiner-16-given"])
def test_a_light_changed_mid_stream_reaches_the_refiner_from_its_frame(config):
    """FlashPipeline.set_light(light, frame) mid-stream: every frame before `frame` keeps the prompt's light,
    every one from it the new one (the refiner applied afterwards with those per-frame lights); None goes
    back to the prompt's. A refiner that reads whether the light was given gets False for the prompt's
    frames and True for the given ones."""
    model = _model(config)
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
    given = (torch.arange(13) >= 7) & (torch.arange(13) < 11)
    assert torch.equal(got, model.refiner.refine(plain, g.images, text, lights, light_given=given))
    if model.refiner.reads_given:  # the flag reaches the network
        assert not torch.allclose(got, model.refiner.refine(plain, g.images, text, lights, light_given=True))
    unlit = pl.FlashPipeline(_model("gbuffer-refiner-16-prompt"), sched)
    with pytest.raises(LightNotRead, match="light: Flash model .* does not read a light"):
        unlit.set_light(sun, 0)


# ---- live: the page's sliders and an engine's light messages ------------------------------------------


def _frames(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 5, 32, 32, 3), dtype=np.uint8)


def _close(a, b) -> bool:
    """uint8 frames equal within one level: a live stream's chunks (1, 4, 4 frames) and one whole step differ by
    float rounding (measured: 3e-6 after a random light-reading refiner, 1.5e-8 without one), which now and
    then tips a pixel over a rounding edge."""
    return a.shape == b.shape and int(np.abs(a.astype(int) - b).max()) <= 1


def _live(live, frames, light_at=None, light=None):
    """Frames through a live renderer chunk by chunk; light_at: the frame from which `light` is set (mid-chunk)."""
    out, i = [], 0
    while i < len(frames):
        n = live.chunk_frames
        if light_at is not None and i <= light_at < i + n:
            live.set_light(light, light_at - i)
        out.append(live.render(frames[i:i + n]))
        i += n
    return np.concatenate(out)


def test_a_live_light_set_mid_chunk_renders_from_its_frame():
    """FlashLive.set_light(light, offset) (an engine's light before its k-th frame) = the Flash pipeline whose
    light schedule switches at frame k; serve --light's schedule = FlashPipeline(lights=...); a reset keeps
    the light set live."""
    from alaya_flash.streaming.live.renderers import FlashLive

    model = _model()
    frames = _frames(9)
    sun = Light(sun_azimuth=-90.0, sun_elevation=15.0)
    live = FlashLive(model, seed=1, fps=30, chunk_latents=1)
    live.set_prompt(PROMPT)
    got = _live(live, frames, light_at=3, light=sun)  # chunks of 1, 4, 4 frames: frame 3 is mid-chunk
    sched = PromptSchedule.constant(model.text_encoder()([PROMPT]), PROMPT)
    lights = prompt_lights(model, sched).changed(3, pack(sun)[0])
    want = to_uint8(pl.FlashPipeline(model, sched, seed=1, chunk_frames=1, lights=lights).step(GBuffers(frames, fps=30)))
    assert got.shape == (9, 32, 32, 3) and _close(got, want)
    live.reset()
    under_sun = to_uint8(pl.FlashPipeline(model, sched, seed=1, chunk_frames=1, lights=LightSchedule.constant(sun))
                         .step(GBuffers(frames, fps=30)))
    assert _close(_live(live, frames), under_sun)
    moving = user_lights(MOVING)
    given = FlashLive(model, seed=1, fps=30, chunk_latents=1, lights=moving)
    given.set_prompt(PROMPT)
    want = to_uint8(pl.FlashPipeline(model, sched, seed=1, chunk_frames=1, lights=moving).step(GBuffers(frames, fps=30)))
    assert _close(_live(given, frames), want)
    unlit = FlashLive(_model("gbuffer-refiner-16-prompt"), chunk_latents=1)
    assert unlit.light_problem == ("Flash model (in memory, RANDOM weights) does not read a light "
                                   "(its refiner is not light-reading)")
    with pytest.raises(LightNotRead):
        unlit.set_light(sun)


def test_serve_light_is_checked_when_the_server_starts(light_folder, prompt_folder, capsys):
    from alaya_flash.streaming.live.renderers import renderer_factory

    assert renderer_factory(model=light_folder, light="az=90")  # reads it
    with pytest.raises(AlayaError, match="^--light: Flash model .* does not read a light \\(its refiner is not "
                                         "light-reading\\)$"):
        renderer_factory(model=prompt_folder, light="az=90")
    with pytest.raises(AlayaError, match="--no-refiner left its refiner out"):
        renderer_factory(model=light_folder, light="az=90", refine=False)
    assert main(["serve", "--model", str(light_folder), "--light", "az=90,el=91", "--port", "0"]) == 2
    assert capsys.readouterr().err.strip() == "alaya-flash: error: --light: sun_elevation 91.0 is outside [-90, 90]"


@pytest.fixture(scope="module")
def light_server(light_folder):
    from alaya_flash.streaming.live.renderers import renderer_factory
    from live_helpers import start_server

    make = renderer_factory(model=light_folder, chunk_latents=1, fps=30.0)
    server = start_server(renderer=make, width=32, height=32, autostart=False, max_sessions=4)
    server.page.ready.wait(120)
    yield server
    server.stop()


def _engine(url, frames, lights=None):
    """Frames through one engine session, with light (dict / text) sent along with the frames named in `lights`;
    returns (the images back, the session's error lines)."""
    from alaya_flash.client import Client

    out = []
    with Client(url, prompt=PROMPT) as client:
        assert client.hello["reads_light"] is True
        for n, g in enumerate(frames):
            client.send(n, g, light=(lights or {}).get(n))
        while len(out) < len(frames):
            frame = client.receive(timeout=120)
            assert frame.number == len(out)
            out.append(frame.image.copy())
        return np.stack(out), list(client.errors)


def test_an_engine_sends_its_light_with_a_frame(light_server):
    """A light sent with frame k (mid-chunk) renders from frame k exactly: the frames before equal a session
    without it, those from k on equal a session lit so from the start; wrong lights are one error line back."""
    url = light_server.url
    frames = _frames(9, seed=4)
    sun = {"sun_azimuth": -90, "sun_elevation": 15}
    plain, errors = _engine(url, frames)
    assert errors == []
    switched, _ = _engine(url, frames, {3: sun})
    lit, _ = _engine(url, frames, {0: sun})
    assert np.array_equal(switched[:3], plain[:3]) and np.array_equal(switched[3:], lit[3:])
    assert np.abs(lit[3:].astype(int) - plain[3:]).max() > 2
    short, _ = _engine(url, frames, {0: "az=-90,el=15"})  # the short form, the same light
    assert np.array_equal(short, lit)
    bad = {0: {"sun_elevation": 95}, 1: {"sun_colour": [1, 1, 1]}, 2: {"sun_azimuth": float("nan")}, 3: "el=-91"}
    images, errors = _engine(url, frames, bad)
    assert errors == ["light: sun_elevation 95 is outside [-90, 90]",
                      "light: unknown light key 'sun_colour'; the keys are sun_azimuth, sun_elevation, sun_color, "
                      "sky_zenith, sky_horizon, ground, ambient, fills, fog_color, fog_density, exposure",
                      "light: sun_azimuth must be a finite number, got nan",
                      "light: sun_elevation -91.0 is outside [-90, 90]"]
    assert np.array_equal(images, plain)  # refused lights change nothing


def _page_errors(url, messages, errors: int) -> list[str]:
    """Send messages over the page's WebSocket; the first `errors` error lines it answers (20 s at most)."""
    import asyncio
    import json

    import aiohttp

    async def talk():
        said = []
        async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "ws") as ws:
            for m in messages:
                await ws.send_str(json.dumps(m))
            while len(said) < errors:
                msg = await ws.receive(timeout=20)
                data = json.loads(msg.data) if msg.type == aiohttp.WSMsgType.TEXT else {}
                if data.get("type") == "error":
                    said.append(data["message"])
        return said

    return asyncio.run(talk())


def _until(check, seconds=20.0):
    import time

    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_the_page_light_message_sets_the_sessions_light_and_refuses_bad_ones():
    """Over the page's WebSocket: a light applies from the next chunk (the status shows it), null hands it back
    to the prompt, a bad one is one error line; a renderer that reads no light refuses every one."""
    from live_helpers import TintRenderer, start_server

    class Unlit(TintRenderer):
        light_problem = "Flash model (m) does not read a light (its refiner is not light-reading)"

    server = start_server(renderer=TintRenderer)
    try:
        assert server.page.ready.wait(60)
        said = _page_errors(server.url, [{"type": "light", "light": {"sun_elevation": 95}},
                                         {"type": "light", "light": {"sun_azimuth": 30, "sun_elevation": 60}},
                                         {"type": "light", "light": {"sun_azimuth": 30}, "at": 3}], errors=2)
        assert said == ["light: sun_elevation 95 is outside [-90, 90]", "light: unknown field 'at'; allowed: light"]
        assert _until(lambda: (server.page.status()["light"] or {}).get("sun_elevation") == 60.0)
        _page_errors(server.url, [{"type": "light", "light": None}], errors=0)
        assert _until(lambda: server.page.status()["light"] is None)
    finally:
        server.stop()
    server = start_server(renderer=Unlit)
    try:
        assert server.page.ready.wait(60)
        assert _page_errors(server.url, [{"type": "light", "light": "az=10"}], errors=1) == [f"light: {Unlit.light_problem}"]
        assert server.page.status()["light_problem"] == Unlit.light_problem
    finally:
        server.stop()


def _light_renderer():
    """The live Flash pipeline on tiny random weights whose refiner reads the light (random: a light change
    shows plainly, through JPEG too)."""
    from alaya_flash.streaming.live.renderers import FlashLive

    return FlashLive(_model(), seed=0, fps=30.0, chunk_latents=1)


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium (.ci/system-deps.sh)")
def test_the_pages_sun_sliders_light_the_stream(tmp_path):
    """In Chromium: dragging the azimuth slider (keyboard on the slider) sets the session's light (the status
    says the preset's light with the sun there) and the frames change; 'from the prompt' hands it back. A
    renderer that reads no light greys the sliders out and says why."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from browser_helpers import chromium
    from live_helpers import TintRenderer, start_server
    from test_live_browser import frames_of, new_epoch, run_epoch, wait_for

    server = start_server(renderer=_light_renderer, width=32, height=32)
    driver = chromium(tmp_path / "chromium")
    try:
        driver.get(server.url + "?video=jpeg")
        wait_for(driver, "window.alaya && window.alaya.frames >= 3", timeout=120, what="frames")
        assert driver.execute_script("return document.getElementById('sun').disabled") is False
        e0 = driver.execute_script("return window.alaya.status.epoch")
        e1 = new_epoch(driver, e0)
        before = run_epoch(driver, e1)
        slider = driver.find_element(By.ID, "sun-azimuth")
        slider.click()  # the middle of the range: 0, the sun ahead
        slider.send_keys(*[Keys.ARROW_LEFT] * 30)
        wanted = driver.execute_script("return Number(document.getElementById('sun-azimuth').value)")
        assert driver.execute_script("return document.getElementById('light-prompt').checked") is False
        light = wait_for(driver, f"window.alaya.status.light && window.alaya.status.light.sun_azimuth === {wanted} "
                         "&& window.alaya.status.light", what="the light applied")
        assert light["sun_elevation"] == 45.0 and light["exposure"] == user_lights("bright_sunny").lights()[0].exposure
        e2 = new_epoch(driver, e1)
        after = run_epoch(driver, e2)
        common = [i for i in before if i in after]
        assert common and any(before[i] != after[i] for i in common)
        driver.find_element(By.ID, "light-prompt").click()
        wait_for(driver, "window.alaya.status.light === null", what="the prompt's light back")
        e3 = new_epoch(driver, e2)
        back = run_epoch(driver, e3)
        same = [i for i in before if i in back]
        assert same and all(before[i] == back[i] for i in same)
        assert frames_of(driver, e3)
    finally:
        driver.quit()
        server.stop()

    class Unlit(TintRenderer):
        light_problem = "Flash model (m) does not read a light (it has no G-buffer refiner)"

    server = start_server(renderer=Unlit)
    driver = chromium(tmp_path / "chromium2")
    try:
        driver.get(server.url + "?video=jpeg")
        wait_for(driver, "document.getElementById('sun').disabled", what="the sliders greyed out")
        assert driver.execute_script("return document.getElementById('sun-note').textContent") == Unlit.light_problem
    finally:
        driver.quit()
        server.stop()
