"""Screenshots of the real ComfyUI canvas after the pack's example workflows ran (docs/comfyui.md).

    cd /path/to/ComfyUI && python main.py --cpu --listen 127.0.0.1 --port 8188 --disable-auto-launch &
    .venv/bin/python integrations/comfyui/comfyui_screenshots.py --out docs/images

Opens the server's own frontend in Debian's headless Chromium (selenium), loads render-gbuffer-videos,
render-long-clip and live-preview from workflows/ as the templates browser does (app.loadGraphData), cuts
the physics world to 48 frames, queues each from the page (app.queuePrompt, as the Run button), waits for ComfyUI's
execution_success and saves a PNG of the canvas: docs/images/comfyui-NAME.png (Save's video and the
Stream Preview node's last frame on their nodes). Also one of the validation error a missing G-buffer
path gives (comfyui-validation-error.png). PNGs are reduced to 256 colours to stay small. For
live-preview it also prints how many of the preview frames the page received while other nodes
ran found a frame on the Stream Preview node (web/stream_preview.js at work). Not part of CI
(ComfyUI is not installed there).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOTS = {  # workflow -> widget values to set first (node type -> {widget: value})
    "render-gbuffer-videos": {},
    "render-long-clip": {},
    "live-preview": {"AlayaFlash_PhysicsWorld": {"frames": 48}},
}

# Queue the loaded graph as the Run button does; resolve with how the run ended, or (settle_on_queued)
# as soon as the page has its answer from POST /prompt. (app.queuePrompt's own return value says
# nothing here: it is false even for a queued prompt.)
QUEUE_JS = """
const [settleOnQueued, done] = arguments;
const {api} = window.comfyAPI.api;
let settled = false;
const settle = (value) => { if (!settled) { settled = true; done(value); } };
for (const kind of ["execution_success", "execution_error", "execution_interrupted"])
  api.addEventListener(kind, ({detail}) => settle({kind, detail}));
window.app.queuePrompt(0, 1).then(() => settleOnQueued && settle({kind: "answered"}))
  .catch((err) => settle({kind: "refused", detail: String(err)}));
"""


# Record, for every preview frame the page receives, which node ran and whether the Stream Preview
# node holds a frame by then (web/stream_preview.js draws the pack's previews on it while they run).
WATCH_JS = """
window.alayaSeen = [];
const {api} = window.comfyAPI.api;
let running = null;
api.addEventListener("executing", ({detail}) => { running = detail; });
api.addEventListener("b_preview", () => setTimeout(() => {
  const node = window.app.graph._nodes.find((n) => n.type === "AlayaFlash_StreamPreview");
  window.alayaSeen.push([String(running), !!(node && node.imgs && node.imgs.length)]);
}, 50));
"""


def browser(width: int, height: int, profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--autoplay-policy=no-user-gesture-required",
                 f"--window-size={width},{height}", f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",  # the page itself at width x height
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    driver.set_script_timeout(600)
    return driver


def open_canvas(driver, server: str) -> None:
    driver.get(server)
    t0 = time.time()
    while not driver.execute_script("return !!(window.app && window.app.graph && window.app.canvas && window.comfyAPI)"):
        if time.time() - t0 > 60:
            raise SystemExit(f"{server}: the ComfyUI frontend did not start in 60 s")
        time.sleep(0.5)
    time.sleep(2)
    close_dialogs(driver)
    for key, value in (("LiteGraph.Canvas.MinFontSizeForLOD", 0),  # full detail at any zoom
                       ("Comfy.Minimap.Visible", False)):
        driver.execute_script("return window.app.extensionManager.setting.set(arguments[0], arguments[1])", key, value)


def close_dialogs(driver) -> None:
    from selenium.webdriver.common.keys import Keys

    for _ in range(3):  # the first-run templates browser, toasts
        driver.find_element("tag name", "body").send_keys(Keys.ESCAPE)
        time.sleep(0.3)


def load(driver, graph: dict, widgets: dict) -> None:
    driver.execute_script("""
        const [graph, widgets] = arguments;
        return window.app.loadGraphData(graph, true, true, "alaya-flash").then(() => {
          for (const node of window.app.graph._nodes)
            for (const [name, value] of Object.entries(widgets[node.type] || {})) {
              const w = node.widgets.find((w) => w.name === name);
              if (w) w.value = value;
            }
        });""", graph, widgets)
    time.sleep(1)
    close_dialogs(driver)


FRAME_JS = """
// Scale and move the canvas so the whole graph shows (at most 80 %), and return its box on the page.
const c = window.app.canvas, rect = c.canvas.getBoundingClientRect(), top = 160;  // below the menus and toasts
let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
for (const n of window.app.graph._nodes) {
  x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - 32);
  x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
}
const s = Math.min(0.8, (rect.width - 200) / (x1 - x0), (rect.height - top - 20) / (y1 - y0));
const left = Math.max(100, (rect.width - (x1 - x0) * s) / 2);  // clear of the side bar
c.ds.scale = s;
c.ds.offset = [left / s - x0, top / s - y0];
c.setDirty(true, true);
return [rect.left + left, rect.top + top, (x1 - x0) * s, (y1 - y0) * s];
"""


def frame(driver) -> list[float]:
    """Fit the graph on the canvas; its box on the page (left, top, width, height)."""
    box = driver.execute_script(FRAME_JS)
    time.sleep(1)
    return box


def save_png(driver, path: Path, box: list[float] | None = None, margin: int = 16) -> None:
    """The page as a 256-colour PNG, cropped to box (left, top, width, height) plus a margin."""
    from io import BytesIO

    from PIL import Image

    image = Image.open(BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    if box is not None:
        left, top, width, height = box
        image = image.crop((max(0, int(left) - margin), max(0, int(top) - margin),
                            min(image.width, int(left + width) + margin), min(image.height, int(top + height) + margin)))
    image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size // 1024} KB, {image.width}x{image.height})", flush=True)


def graph_types(graph: dict) -> dict[str, str]:
    return {str(n["id"]): n["type"] for n in graph["nodes"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="http://127.0.0.1:8188", help="ComfyUI server URL")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="folder for comfyui-*.png")
    p.add_argument("--size", default="1700x1000", help="browser window, WIDTHxHEIGHT")
    args = p.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        driver = browser(width, height, profile)
        try:
            open_canvas(driver, args.server.rstrip("/"))
            for name, widgets in SHOTS.items():
                graph = json.loads((ROOT / "workflows" / f"{name}.json").read_text())
                load(driver, graph, widgets)
                frame(driver)
                driver.execute_script(WATCH_JS)
                t0 = time.time()
                end = driver.execute_async_script(QUEUE_JS, False)
                if end["kind"] != "execution_success":
                    print(f"{name}: {end['kind']} {json.dumps(end.get('detail'))[:400]}")
                    for line in driver.get_log("browser")[-5:]:
                        print("  browser:", line.get("message", "")[:600])
                    return 1
                print(f"{name}: ran in {time.time() - t0:.1f} s", flush=True)
                seen = driver.execute_script("return window.alayaSeen")
                preview = [k for k, v in graph_types(graph).items() if v == "AlayaFlash_StreamPreview"]
                if preview:
                    seen = [(n, shown) for n, shown in seen if n.isdigit() and n not in preview]
                    early = [n for n, shown in seen if shown]
                    print(f"  Stream Preview held a frame at {len(early)} of the {len(seen)} previews the page got "
                          f"while other nodes ran (nodes {', '.join(sorted(set(early), key=int))})", flush=True)
                time.sleep(3)  # the outputs (video, last frame) load on their nodes
                save_png(driver, args.out / f"comfyui-{name}.png", frame(driver))
            graph = json.loads((ROOT / "workflows" / "render-gbuffer-sequence.json").read_text())
            load(driver, graph, {"AlayaFlash_LoadGBuffers": {"path": "shots/no-such-shot"}})
            frame(driver)
            driver.execute_async_script(QUEUE_JS, True)
            time.sleep(2)  # the error dialog opens
            save_png(driver, args.out / "comfyui-validation-error.png")
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
