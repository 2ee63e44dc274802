"""web/stream_preview.js and web/node_status.js in a real headless Chromium, against stand-ins for
ComfyUI's frontend modules.

The extensions are served where ComfyUI serves a pack's web folder (/extensions/alaya-flash/), with
/scripts/app.js and /scripts/api.js replaced by small stubs that record what they do: a graph of
four nodes (a Flash Sampler, a Stream Preview, Load G-Buffers and another pack's node) and an
EventTarget for the websocket messages. A preview frame sent while the sampler runs lands on the
Stream Preview node; one sent while Load G-Buffers (an albedo) or another pack's node runs does not,
and until the first rendered frame the Stream Preview says it is waiting. A pack node's text result
is drawn on it.
"""
import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from browser_helpers import chromium, needs_chromium

ROOT = Path(__file__).resolve().parents[1]
pytestmark = needs_chromium

APP_STUB = """
const nodes = [{id: 5, type: "AlayaFlash_FlashSampler"}, {id: 9, type: "AlayaFlash_StreamPreview"},
               {id: 12, type: "KSampler"}, {id: 1, type: "AlayaFlash_LoadGBuffers"}];
export const app = {
  graph: {_nodes: nodes, dirty: 0, getNodeById(id) { return nodes.find((n) => n.id === id) ?? null; },
          setDirtyCanvas() { this.dirty += 1; }},
  extensions: [],
  registerExtension(ext) { this.extensions.push(ext); ext.setup?.(); },
};
window.app = app;
"""
API_STUB = "export const api = new EventTarget(); window.api = api;"
PAGE = """<!doctype html><meta charset="utf-8"><body><script type="module">
import "/scripts/app.js"; import "/scripts/api.js"; import "/extensions/alaya-flash/stream_preview.js";
import * as nodeStatus from "/extensions/alaya-flash/node_status.js";
window.nodeStatus = nodeStatus;
window.ready = true;
</script></body>"""
SEND = """
const [nodeId, done] = [arguments[0], arguments[arguments.length - 1]];
window.api.dispatchEvent(new CustomEvent("executing", {detail: nodeId}));
const canvas = document.createElement("canvas"); canvas.width = 4; canvas.height = 3;
canvas.toBlob((blob) => {
  window.api.dispatchEvent(new CustomEvent("b_preview", {detail: blob}));
  setTimeout(() => {
    const shown = window.app.graph._nodes.find((n) => n.type === "AlayaFlash_StreamPreview").imgs;
    done({shown: shown ? shown[0].naturalWidth + "x" + shown[0].naturalHeight : null, dirty: window.app.graph.dirty});
  }, 300);
}, "image/png");
"""


@pytest.fixture
def site(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(APP_STUB)
    (tmp_path / "scripts" / "api.js").write_text(API_STUB)
    (tmp_path / "extensions").mkdir()
    shutil.copytree(ROOT / "web", tmp_path / "extensions" / "alaya-flash")
    (tmp_path / "index.html").write_text(PAGE)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()


def test_stream_preview_node_shows_the_packs_preview_frames(site, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium(tmp_path / "chromium", script_timeout=10)
    try:
        driver.get(site)
        WebDriverWait(driver, 10).until(lambda d: d.execute_script("return window.ready === true"))
        names = driver.execute_script("return window.app.extensions.map((e) => e.name)")
        assert names == ["alaya-flash.node-status", "alaya-flash.stream-preview"]  # each once
        other = driver.execute_async_script(SEND, 12)  # another pack's node: not shown
        assert other == {"shown": None, "dirty": 0}
        driver.execute_script('window.api.dispatchEvent(new CustomEvent("execution_start", {detail: {}}))')
        assert driver.execute_script(WAITING) is True
        albedo = driver.execute_async_script(SEND, 1)  # Load G-Buffers' albedo: not a rendered frame
        assert albedo["shown"] is None and driver.execute_script(WAITING) is True
        ours = driver.execute_async_script(SEND, 5)  # the Flash Sampler's chunk preview
        assert ours["shown"] == "4x3" and driver.execute_script(WAITING) is False
    finally:
        driver.quit()


WAITING = 'return window.app.graph._nodes.find((n) => n.type === "AlayaFlash_StreamPreview").alayaWaiting'
STATUS = """
// a node class as ComfyUI registers it: the extensions wrap its prototype; then an "executed" output
const ext = window.app.extensions.find((e) => e.name === arguments[0]);
function NodeType() {}
ext.beforeRegisterNodeDef(NodeType, {name: arguments[1]});
const node = new NodeType();
node.size = [300, 200];
node.onExecuted?.({text: ["steps 4* · chunk 1*  (*: the model's)"]});
const drawn = [];
const ctx = {save() {}, restore() {}, fillRect() {}, fillText(text, x, y) { drawn.push([text, Math.round(y)]); }};
node.onDrawForeground?.(ctx);
return drawn;
"""


def test_pack_nodes_show_their_text_result(site, tmp_path):
    """A pack node's ui text (a sampler's resolved settings) is drawn along its bottom edge; another
    pack's node is left alone; a waiting Stream Preview says so in the same strip."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium(tmp_path / "chromium", script_timeout=10)
    try:
        driver.get(site)
        WebDriverWait(driver, 10).until(lambda d: d.execute_script("return window.ready === true"))
        drawn = driver.execute_script(STATUS, "alaya-flash.node-status", "AlayaFlash_FlashSampler")
        assert drawn == [["steps 4* · chunk 1*  (*: the model's)", 200 - 21 + 3]]
        assert driver.execute_script(STATUS, "alaya-flash.node-status", "KSampler") == []
        # a line wider than the node is cut in the middle to fit (Save's "wrote N frames to /a/long/path.mp4")
        cut = driver.execute_script("""
            const {fit} = window.nodeStatus;
            const ctx = document.createElement("canvas").getContext("2d");
            ctx.font = "12px sans-serif";
            const line = "wrote 17 frames to /work/comfyui/output/alaya-flash/a/very/long/folder/long-clip.mp4";
            const cut = fit(ctx, line, 200);
            return [cut, ctx.measureText(cut).width, fit(ctx, "short", 200)];""")
        assert cut[0].startswith("wrote 17 frames") and cut[0].endswith("long-clip.mp4") and "…" in cut[0]
        assert cut[1] <= 200 and cut[2] == "short"
        waiting = driver.execute_script(STATUS.replace("const drawn", "node.alayaWaiting = true;\nconst drawn"),
                                        "alaya-flash.stream-preview", "AlayaFlash_StreamPreview")
        assert waiting == [["waiting for the first rendered frame", 200 - 21 + 3]]
    finally:
        driver.quit()
