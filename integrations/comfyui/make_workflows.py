"""Write the saved workflows in workflows/: each in ComfyUI's UI format (workflows/NAME.json, the pack's
templates) and its API twin (workflows/api/NAME.json).

    .venv/bin/python integrations/comfyui/make_workflows.py                  # rewrites workflows/*.json and workflows/api/*.json
    .venv/bin/python integrations/comfyui/make_workflows.py --thumbnails [NAME ...]  # also renders workflows/NAME.jpg

Each template's thumbnail (NAME.jpg beside NAME.json, where ComfyUI's template browser looks for it) is
the last frame of its own output, rendered with the workflow as shipped (the physics world cut to
THUMB_FRAMES frames), side by side when it has two outputs.

The graphs are defined once here (API form); the UI form is laid out left to right by graph
depth, with widget values in the canvas's positional order (a control value after seeds) and
one link per connected socket. tests/test_workflows.py checks that converting each UI file back
gives its API twin and that both validate against the node classes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODEL = {"model": "default", "decoder": "(from model)", "device": "auto", "precision": "auto", "text_encoder": "(from model)"}
TEACHER = {"model": "default/teacher", "vae": "(from model)", "window_frames": -1, "device": "auto", "precision": "auto",
           "text_encoder": "(from model)"}
SAMPLER = {"seed": 0, "steps": -1, "chunk_frames": -1, "window_frames": -1, "sink_frames": -1}  # -1: the model's
LOAD = {"path": "samples/courtyard", "layout": "auto", "start": 0, "frames": 0, "stride": 1, "resize": "stretch",
        "width": 0, "height": 0, "chunk": 16, "conventions": "auto", "depth_range": "0.5"}


def L(node: str, slot: int = 0) -> list:
    return [node, slot]


def flash_branch(source: str, first: int, prompt: str, save: dict) -> dict:
    """Load Flash Model .. Refine .. Save, fed by the G-buffer source `source`; node ids from `first`."""
    m, p, e, s, d, r, o = (str(first + i) for i in range(7))
    return {
        m: ("AlayaFlash_LoadFlashModel", "Load Flash Model", dict(MODEL)),
        p: ("AlayaFlash_EncodePrompt", "Encode Prompt", {"text_encoder": L(m, 3), "text": prompt, "style": "original"}),
        e: ("AlayaFlash_EncodeGBuffers", "Encode G-Buffers", {"gbuffer_encoder": L(m, 1), "gbuffers": L(source), "prompt": L(p)}),
        s: ("AlayaFlash_FlashSampler", "Flash Sampler", {"model": L(m), "cond": L(e), "prompt": L(p), **SAMPLER}),
        d: ("AlayaFlash_Decode", "Decode", {"decoder": L(m, 2), "latents": L(s)}),
        r: ("AlayaFlash_Refine", "Refine with G-Buffers", {"refiner": L(m, 4), "images": L(d), "gbuffers": L(source),
                                                             "prompt": L(p)}),
        o: save(r),
    }


def _save(filename: str, fmt: str = "mp4", title: str = "Save"):
    return lambda images: ("AlayaFlash_Save", title, {"images": L(images), "filename": filename, "format": fmt,
                                                      "fps": 16.0, "overwrite": True})


def teacher_branch(source: str, first: int, prompt: str, negative: str, save) -> dict:
    """Load Teacher Model .. Decode (full VAE) .. Save, fed by the G-buffer source; node ids from `first`."""
    m, p, e, s, d, o = (str(first + i) for i in range(6))
    return {
        m: ("AlayaFlash_LoadTeacherModel", "Load Teacher Model", dict(TEACHER)),
        p: ("AlayaFlash_EncodePrompt", "Encode Prompt (teacher)", {"text_encoder": L(m, 3), "text": prompt, "style": "original"}),
        e: ("AlayaFlash_EncodeGBuffers", "Encode G-Buffers (teacher)", {"gbuffer_encoder": L(m, 1), "gbuffers": L(source)}),
        s: ("AlayaFlash_TeacherSampler", "Teacher Sampler", {"model": L(m), "cond": L(e), "prompt": L(p),
                                                              "negative_prompt": negative, "seed": 0,
                                                              "steps": -1, "cfg": -1.0, "shift": -1.0}),
        d: ("AlayaFlash_Decode", "Decode (full VAE)", {"decoder": L(m, 2), "latents": L(s)}),
        o: save(d),
    }


# nodes that show a frame on the canvas during or after a run (progress previews, Save's video): room
# for it under their widgets, so that the node does not grow over the node below it in its column
SHOWS_IMAGE = {"AlayaFlash_LoadGBuffers", "AlayaFlash_LoadGBufferVideos", "AlayaFlash_RenderGBufferStream",
               "AlayaFlash_PhysicsWorld", "AlayaFlash_EncodeGBuffers", "AlayaFlash_FlashSampler",
               "AlayaFlash_Decode", "AlayaFlash_Refine", "AlayaFlash_Save", "AlayaFlash_StreamPreview"}
IMAGE_ROOM = 240

WORKFLOWS = {
    "render-teacher": {
        "1": ("AlayaFlash_LoadGBuffers", "Load G-Buffers", dict(LOAD)),
        **teacher_branch("1", 2, "a sunny city street, photorealistic", "", _save("alaya-flash/teacher.mp4")),
    },
    "render-gbuffer-sequence": {
        "1": ("AlayaFlash_LoadGBuffers", "Load G-Buffers", dict(LOAD)),
        **flash_branch("1", 2, "a sunny city street, photorealistic", _save("alaya-flash/render.mp4")),
    },
    "physics-world-demo": {
        "1": ("AlayaFlash_PhysicsWorld", "Physics World", {"seed": 0, "width": 128, "height": 128, "frames": 32,
                                                            "objects": 12, "camera": "orbit", "fps": 16.0, "chunk": 16}),
        **flash_branch("1", 2, "0: toys on a wooden floor, morning light\n16: toys on a wooden floor, night, lamp light",
                       _save("alaya-flash/world.mp4")),
    },
    "teacher-vs-flash": {
        "1": ("AlayaFlash_LoadGBuffers", "Load G-Buffers", dict(LOAD)),
        **flash_branch("1", 2, "a sunny city street, photorealistic", _save("alaya-flash/flash.mp4", title="Save Flash")),
        **teacher_branch("1", 9, "a sunny city street, photorealistic", "blurry, distorted",
                         _save("alaya-flash/teacher.mp4", title="Save Teacher")),
    },
    "render-gbuffer-videos": {
        "1": ("AlayaFlash_LoadGBufferVideos", "Load G-Buffer Videos", {"clip": "samples/courtyard", "start": 0, "frames": 0,
                                                                       "width": 0, "height": 0, "chunk": 16}),
        **flash_branch("1", 2, "a sunny city street, photorealistic", _save("alaya-flash/videos.mp4")),
    },
    "render-long-clip": {
        "1": ("AlayaFlash_LoadFlashModel", "Load Flash Model", dict(MODEL)),
        "2": ("AlayaFlash_EncodePrompt", "Encode Prompt", {"text_encoder": L("1", 3), "text": "a sunny city street, photorealistic"}),
        "3": ("AlayaFlash_RenderGBufferStream", "Render G-Buffer Stream", {
            "model": L("1"), "prompt": L("2"), "path": "samples/courtyard", "start": 0, "frames": 0, "width": 0, "height": 0,
            "chunk": 16, **SAMPLER, "filename": "alaya-flash/long-clip.mp4", "format": "mp4", "fps": 16.0, "overwrite": True}),
    },
    "live-preview": {
        "1": ("AlayaFlash_PhysicsWorld", "Physics World", {"seed": 0, "width": 128, "height": 128, "frames": 1000,
                                                            "objects": 12, "camera": "orbit", "fps": 16.0, "chunk": 12}),
        **flash_branch("1", 2, "toys on a wooden floor, soft light",
                       lambda images: ("AlayaFlash_StreamPreview", "Stream Preview", {"images": L(images), "filename": "alaya-flash/latest.jpg"})),
    },
}


def to_api(graph: dict, classes: dict) -> dict:
    """The API form: each node's inputs, with every widget it does not set at its default (as the canvas has it)."""
    from alaya_flash.streaming.render.workflow import widget_inputs

    out = {}
    for nid, (cls, title, inputs) in graph.items():
        full = dict(inputs)
        for name, spec in widget_inputs(classes[cls]):
            full.setdefault(name, (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}).get("default"))
        out[nid] = {"class_type": cls, "inputs": full, "_meta": {"title": title}}
    return out


def to_ui(graph: dict, classes: dict) -> dict:
    from alaya_flash.streaming.render.workflow import _has_control_value, widget_inputs

    depth: dict[str, int] = {}

    def d(nid: str) -> int:
        if nid not in depth:
            ups = [v[0] for v in graph[nid][2].values() if isinstance(v, list)]
            depth[nid] = 1 + max((d(u) for u in ups), default=-1)
        return depth[nid]

    rows: dict[int, int] = {}
    nodes, links = [], []
    out_links: dict[tuple[str, int], list[int]] = {}
    for nid, (cls_name, title, inputs) in graph.items():
        for name, v in inputs.items():
            if isinstance(v, list):
                links.append([len(links) + 1, int(v[0]), v[1], int(nid), None, None, name])
                out_links.setdefault((v[0], v[1]), []).append(len(links))
    link_by_target = {(str(l[3]), l[6]): l for l in links}
    for order, nid in enumerate(sorted(graph, key=lambda n: (d(n), int(n)))):
        cls_name, title, inputs = graph[nid]
        cls = classes[cls_name]
        types = cls.INPUT_TYPES()
        widgets = widget_inputs(cls)
        widget_names = {n for n, _ in widgets}
        values = []
        for name, spec in widgets:
            opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            values.append(inputs.get(name, opts.get("default")))
            if _has_control_value(name, spec):
                values.append("fixed")
        sockets = []
        for section in ("required", "optional"):
            for name, spec in (types.get(section) or {}).items():
                if name in widget_names:
                    continue
                link = link_by_target.get((nid, name))
                if link is not None:
                    link[4] = len(sockets)
                    link[5] = spec[0]
                sockets.append({"name": name, "type": spec[0], "link": link[0] if link else None})
        outputs = [{"name": (getattr(cls, "RETURN_NAMES", None) or cls.RETURN_TYPES)[i], "type": t,
                    "links": out_links.get((nid, i), []), "slot_index": i} for i, t in enumerate(cls.RETURN_TYPES)]
        col = d(nid)
        row = rows.get(col, 0)
        height = 60 + 26 * len(values) + 22 * max(len(sockets), len(outputs))
        height += IMAGE_ROOM if cls_name in SHOWS_IMAGE else 0
        rows[col] = row + height + 40
        nodes.append({"id": int(nid), "type": cls_name, "title": title, "pos": [40 + 380 * col, 40 + row],
                      "size": [340, height], "flags": {}, "order": order, "mode": 0, "inputs": sockets,
                      "outputs": outputs, "properties": {"Node name for S&R": cls_name}, "widgets_values": values})
    return {"id": "00000000-0000-4000-8000-000000000000", "revision": 0, "last_node_id": max(int(n) for n in graph),
            "last_link_id": len(links), "nodes": nodes, "links": [l[:6] for l in links], "groups": [], "config": {},
            "extra": {"ds": {"scale": 0.8, "offset": [0, 0]}}, "version": 0.4}


THUMB_FRAMES = 32  # physics-world frames rendered for a thumbnail
THUMB_HEIGHT = 160  # pixels


def thumbnail(api: dict, work: Path):
    """The last frame of each output of `api` (run with `alaya-flash run`), side by side, as a PIL image."""
    from PIL import Image

    from alaya_flash.streaming.cli import main as cli

    api, frames = json.loads(json.dumps(api)), []
    for nid, node in sorted(api.items(), key=lambda kv: int(kv[0])):
        inputs = node["inputs"]
        if node["class_type"] == "AlayaFlash_PhysicsWorld":
            inputs["frames"] = min(inputs["frames"], THUMB_FRAMES)
        elif node["class_type"] in ("AlayaFlash_Save", "AlayaFlash_RenderGBufferStream"):
            inputs.update(filename=str(work / nid), format="png", overwrite=True)
            frames.append(lambda folder=work / nid: max(folder.glob("*.png")))
        elif node["class_type"] == "AlayaFlash_StreamPreview":
            inputs["filename"] = str(work / f"{nid}.jpg")
            frames.append(lambda path=work / f"{nid}.jpg": path)
    (work / "graph.json").write_text(json.dumps(api))
    if cli(["--quiet", "run", str(work / "graph.json")]) != 0:
        raise SystemExit("the workflow did not run")
    images = [Image.open(find()).convert("RGB") for find in frames]
    images = [im.resize((round(im.width * THUMB_HEIGHT / im.height), THUMB_HEIGHT), Image.LANCZOS) for im in images]
    sheet = Image.new("RGB", (sum(im.width for im in images) + 4 * (len(images) - 1), THUMB_HEIGHT), "white")
    x = 0
    for im in images:
        sheet.paste(im, (x, 0))
        x += im.width + 4
    return sheet


def main() -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--thumbnails", nargs="*", metavar="NAME",
                   help="also render the thumbnails workflows/NAME.jpg (of these workflows; all when none is named)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import conftest  # noqa: F401  (registers the checkout as alaya_flash)
    from alaya_flash.nodes import NODE_CLASS_MAPPINGS

    # ComfyUI lists workflows/*.json (not its subfolders) as the pack's templates
    out, api = ROOT / "workflows", ROOT / "workflows" / "api"
    api.mkdir(parents=True, exist_ok=True)
    for name, graph in WORKFLOWS.items():
        (out / f"{name}.json").write_text(json.dumps(to_ui(graph, NODE_CLASS_MAPPINGS), indent=1) + "\n")
        (api / f"{name}.json").write_text(json.dumps(to_api(graph, NODE_CLASS_MAPPINGS), indent=1) + "\n")
        print(f"wrote workflows/{name}.json and workflows/api/{name}.json")
        if args.thumbnails is not None and (not args.thumbnails or name in args.thumbnails):
            with tempfile.TemporaryDirectory() as work:
                thumbnail(to_api(graph, NODE_CLASS_MAPPINGS), Path(work)).save(out / f"{name}.jpg", quality=85, optimize=True)
            print(f"wrote workflows/{name}.jpg ({(out / f'{name}.jpg').stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
