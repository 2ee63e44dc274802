// Stream Preview (Alaya Flash) on the canvas: while the pack's nodes run, every rendered preview frame
// they send over ComfyUI's websocket (the Flash Sampler's chunk frames, Decode's and Refine's newest
// frames) is also drawn on each Stream Preview node, so the stream shows there as it renders instead
// of only when the whole graph is done. The G-buffer nodes' previews (albedo) are not rendered frames:
// until the first rendered frame comes, the node says it is waiting for one.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { drawStrip } from "./node_status.js";

const PREVIEW_NODE = "AlayaFlash_StreamPreview";
// the pack's nodes whose previews are rendered frames (the others preview the G-buffers' albedo)
export const RENDERING = new Set(["AlayaFlash_FlashSampler", "AlayaFlash_Decode", "AlayaFlash_Refine",
                                  "AlayaFlash_RenderGBufferStream", PREVIEW_NODE]);
export const WAITING = "waiting for the first rendered frame";

let running = null; // id of the node ComfyUI runs now (the "executing" message)
let shownUrl = null;

function nodeById(id) {
  return id == null ? null : app.graph.getNodeById?.(Number(id)) ?? app.graph.getNodeById?.(id) ?? null;
}

function previewNodes() {
  return (app.graph._nodes ?? []).filter((n) => n.type === PREVIEW_NODE);
}

// A prompt starts: every Stream Preview node waits for its first rendered frame.
export function startWaiting() {
  for (const node of previewNodes()) node.alayaWaiting = true;
  app.graph.setDirtyCanvas(true, true);
}

export function stopWaiting() {
  for (const node of previewNodes()) node.alayaWaiting = false;
  app.graph.setDirtyCanvas(true, true);
}

// Draw an image blob on every Stream Preview node when it is a frame one of the pack's nodes rendered.
export function showPreview(blob, fromNodeId = running) {
  const source = nodeById(fromNodeId);
  if (!source || !RENDERING.has(String(source.type))) return 0;
  const targets = previewNodes();
  if (!targets.length) return 0;
  const url = URL.createObjectURL(blob);
  const img = new Image();
  img.onload = () => {
    for (const node of targets) {
      node.imgs = [img];
      node.imageIndex = 0;
      node.alayaWaiting = false;
    }
    app.graph.setDirtyCanvas(true, true);
    if (shownUrl) URL.revokeObjectURL(shownUrl);
    shownUrl = url;
  };
  img.src = url;
  return targets.length;
}

app.registerExtension({
  name: "alaya-flash.stream-preview",
  setup() {
    api.addEventListener("executing", ({ detail }) => {
      running = detail && typeof detail === "object" ? detail.node : detail;
    });
    api.addEventListener("b_preview", ({ detail }) => showPreview(detail));
    api.addEventListener("execution_start", () => startWaiting());
    for (const end of ["execution_success", "execution_error", "execution_interrupted"])
      api.addEventListener(end, () => stopWaiting());
  },
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== PREVIEW_NODE) return;
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      if (this.alayaWaiting) drawStrip(this, ctx, [WAITING], "#fc6");
    };
  },
});
