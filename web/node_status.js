// Each pack node's text after a run, drawn in a strip along the node's bottom edge: the text of the
// node's ComfyUI "ui" result (the samplers' settings with -1 resolved, "steps 4* · chunk 1* ...";
// Load Teacher Model's window; Save's "wrote N frames to ..."). ComfyUI's frontend shows a node's
// images but not its text.
import { app } from "../../scripts/app.js";

const PACK_PREFIX = "AlayaFlash_";
const LINE = 15;

// The lines to show for a node's "executed" output ({text: [...], images: [...]}).
export function statusLines(output) {
  const text = output?.text;
  return Array.isArray(text) ? text.map(String).filter((line) => line.length) : [];
}

// `line` cut in the middle ("wrote 17 frames to /work/…/long-clip.mp4") to fit `width` pixels.
export function fit(ctx, line, width) {
  if (!ctx.measureText || ctx.measureText(line).width <= width) return line;
  let keep = line.length - 1;
  while (keep > 8) {
    const head = Math.ceil(keep / 2), cut = line.slice(0, head) + "…" + line.slice(line.length - (keep - head));
    if (ctx.measureText(cut).width <= width) return cut;
    keep -= 1;
  }
  return line.slice(0, 8) + "…";
}

// Draw `lines` in a dark strip along the bottom of the node (node-local coordinates).
export function drawStrip(node, ctx, lines, color = "#ddd") {
  if (!lines?.length || node.flags?.collapsed) return;
  const height = lines.length * LINE + 6;
  const top = node.size[1] - height;
  ctx.save();
  ctx.fillStyle = "rgba(0, 0, 0, 0.7)";
  ctx.fillRect(0, top, node.size[0], height);
  ctx.fillStyle = color;
  ctx.font = "12px sans-serif";
  ctx.textBaseline = "top";
  ctx.textAlign = "left";
  // a little too wide: squeezed by fillText; far too wide: cut in the middle first
  const width = node.size[0] - 12;
  lines.forEach((line, i) => ctx.fillText(fit(ctx, line, 1.25 * width), 6, top + 3 + i * LINE, width));
  ctx.restore();
}

export const extension = {
  name: "alaya-flash.node-status",
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (!String(nodeData?.name).startsWith(PACK_PREFIX)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output) {
      onExecuted?.apply(this, arguments);
      this.alayaStatus = statusLines(output);
      this.setDirtyCanvas?.(true, true);
    };
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      drawStrip(this, ctx, this.alayaStatus);
    };
  },
};

app.registerExtension(extension);
