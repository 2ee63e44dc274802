// Stream Preview (Alaya Flash) on the canvas: while the pack's nodes run, every preview frame they
// send over ComfyUI's websocket (the progress-bar previews: the Flash Sampler's chunk frames,
// Decode's and Refine's newest frames) is also drawn on each Stream Preview node, so the stream
// shows there as it renders instead of only when the whole graph is done.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const PREVIEW_NODE = "AlayaFlash_StreamPreview";
const PACK_PREFIX = "AlayaFlash_";

let running = null; // id of the node ComfyUI runs now (the "executing" message)
let shownUrl = null;

function nodeById(id) {
  return id == null ? null : app.graph.getNodeById?.(Number(id)) ?? app.graph.getNodeById?.(id) ?? null;
}

function previewNodes() {
  return (app.graph._nodes ?? []).filter((n) => n.type === PREVIEW_NODE);
}

// Draw an image blob on every Stream Preview node when it comes from one of the pack's nodes.
export function showPreview(blob, fromNodeId = running) {
  const source = nodeById(fromNodeId);
  if (!source || !String(source.type).startsWith(PACK_PREFIX)) return 0;
  const targets = previewNodes();
  if (!targets.length) return 0;
  const url = URL.createObjectURL(blob);
  const img = new Image();
  img.onload = () => {
    for (const node of targets) {
      node.imgs = [img];
      node.imageIndex = 0;
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
  },
});
