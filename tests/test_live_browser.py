"""The live page in a real headless browser (Debian's chromium, driven by selenium) on 127.0.0.1.

The server renders with the real Flash pipeline on tiny random weights, at 32x32 and one latent
frame per chunk, so the test is about the page and the plumbing, not the pictures.

Checks what a person would: the page loads, frames arrive and change, the FPS readout shows a
number, a prompt change changes the output (same indices, same seed: equal before, different
after), and a key press moves the player (the G-buffer passes change and the ball moves forward).
"""
import time

import pytest

from browser_helpers import chromium, needs_chromium
from live_helpers import start_server

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    server = start_server(**LIVE_OPTIONS)
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    try:
        driver.get(server.url + "?video=jpeg")  # JPEG digests per frame (WebRTC: tests/test_live_webrtc.py)
        yield driver, server
    finally:
        driver.quit()
        server.stop()


def flash_renderer():
    """Tiny random Flash model. Random weights barely listen to the prompt (text projection std
    0.03: a prompt change moves ~0.3 % of 8-bit values by 1); scaled up 30x here so that a prompt
    change survives JPEG. Everything else is the standard live Flash pipeline."""
    import torch

    from alaya_flash.model_zoo import bundle
    from alaya_flash.streaming.live.renderers import FlashLive

    model = bundle.make_random_flash(seed=0)
    with torch.no_grad():
        model.dit.text_embedding[0].weight.mul_(30)
    return FlashLive(model, seed=0, fps=30.0, chunk_latents=1)


LIVE_OPTIONS = {"renderer": flash_renderer, "width": 32, "height": 32}


def wait_for(driver, script, timeout=60.0, what=""):
    """Poll a JS expression until it is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script("return " + script)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or script}")


def frames_of(driver, epoch, kind="rgb"):
    return driver.execute_script(
        "return window.alaya.history.filter(r => r.kind === arguments[0] && r.epoch === arguments[1])"
        ".map(r => [r.index, r.digest, r.player])", kind, epoch)


def new_epoch(driver, after, prompt=None):
    """Press Reset (after setting a prompt, if given) and wait for the next epoch's status."""
    from selenium.webdriver.common.by import By

    if prompt is not None:
        box = driver.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys(prompt)
        driver.find_element(By.ID, "apply").click()
        wait_for(driver, f"window.alaya.status && window.alaya.status.prompt === {prompt!r}", what="prompt applied")
    driver.find_element(By.ID, "reset").click()
    return wait_for(driver, f"window.alaya.status.epoch > {after} && window.alaya.status.epoch", what="reset")


def run_epoch(driver, epoch, n=5, kind="rgb"):
    wait_for(driver, f"window.alaya.history.filter(r => r.kind === {kind!r} && r.epoch === {epoch}).length >= {n}",
             what=f"{n} {kind} frames of epoch {epoch}")
    return {i: d for i, d, _ in frames_of(driver, epoch, kind)}


def test_page_loads_frames_arrive_and_change(page):
    driver, _ = page
    assert "alaya-flash" in driver.title
    wait_for(driver, "window.alaya && window.alaya.frames >= 5", timeout=120, what="frames")
    digests = {r[1] for r in frames_of(driver, driver.execute_script("return window.alaya.last.epoch"))}
    assert len(digests) > 1
    fps = wait_for(driver, "parseFloat(document.getElementById('fps').textContent) > 0 && "
                   "document.getElementById('fps').textContent", what="FPS readout")
    assert float(fps.split()[0]) > 0
    assert driver.execute_script("return document.getElementById('latency').textContent").endswith("ms")
    # capture -> display from the capture time in each frame's header (one machine: one clock)
    shown = wait_for(driver, "window.alaya.displayMs.length >= 3 && window.alaya.displayMs", what="display latencies")
    assert all(0 <= ms < 600_000 for ms in shown)
    options = driver.execute_script("return Array.from(document.querySelectorAll('#preset option')).map(o => o.value)")
    assert "sunset_dramatic" in options


def test_prompt_change_changes_the_output(page):
    driver, _ = page
    e0 = driver.execute_script("return window.alaya.status.epoch")
    e1 = new_epoch(driver, e0, prompt="a watercolour painting")
    a = run_epoch(driver, e1)
    e2 = new_epoch(driver, e1)  # same prompt, same seed: the same frames
    a2 = run_epoch(driver, e2)
    same = [i for i in a if i in a2]
    assert same and all(a[i] == a2[i] for i in same)
    e3 = new_epoch(driver, e2, prompt="a neon cyberpunk night")
    b = run_epoch(driver, e3)
    common = [i for i in a if i in b]
    assert common and any(a[i] != b[i] for i in common)


def test_key_press_moves_the_player(page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver, _ = page
    driver.find_element(By.ID, "show-passes").click()
    driver.find_element(By.ID, "view").click()  # focus the picture, as a player would
    e0 = driver.execute_script("return window.alaya.status.epoch")
    e1 = new_epoch(driver, e0)
    baseline = run_epoch(driver, e1, n=21, kind="passes")
    e2 = new_epoch(driver, e1)
    run_epoch(driver, e2, n=3, kind="passes")
    driver.find_element(By.ID, "view").click()
    y0 = frames_of(driver, e2, "passes")[-1][2][1]
    ActionChains(driver).key_down("w").perform()
    try:
        wait_for(driver, f"window.alaya.lastPasses.epoch === {e2} && window.alaya.lastPasses.player[1] > {y0 + 0.1}",
                 what="the player moving forward")
    finally:
        ActionChains(driver).key_up("w").perform()
    moved = {i: d for i, d, _ in frames_of(driver, e2, "passes")}
    common = [i for i in moved if i in baseline]
    assert common and any(moved[i] != baseline[i] for i in common)
    assert driver.execute_script("return window.alaya.errors.length") == 0
