"""Check the pack against a running ComfyUI server, as an artist meets it on the canvas.

    cd /path/to/ComfyUI && python main.py --cpu --listen 127.0.0.1 --port 8188 --disable-auto-launch &
    .venv/bin/python integrations/comfyui/comfyui_check.py --comfyui /path/to/ComfyUI --server http://127.0.0.1:8188

1. nodes: GET /object_info lists every node id of NODE_CLASS_MAPPINGS (the pack imported cleanly), and
   GET /extensions lists web/stream_preview.js once (twice and the frontend refuses the second copy).
2. defaults: /object_info shows the model-owned defaults: the sampler widgets (Flash Sampler steps,
   chunk_frames, window_frames, sink_frames; Teacher Sampler steps, cfg, shift; Load Teacher Model
   window_frames) at -1, the loaded model's trained value; devices and precisions "auto"; decoders,
   VAEs and text encoders "(from model)".
3. templates: GET /api/workflow_templates lists the pack's workflows/*.json, each once, and nothing else,
   and each one's thumbnail (GET /api/workflow_templates/PACK/NAME.jpg, what the template browser asks
   for) is a JPEG.
4. validation: a render workflow whose Load G-Buffers path does not exist is refused by POST /prompt
   with exactly one error, on that node's `path` input, saying the G-buffer path was not found.
5. workflows: each workflows/api/*.json is queued as shipped (the bundled samples/courtyard clip, the
   embedded default models; the physics world shrunk to 64x64 and 24 frames; outputs under
   output/alaya-flash-check/) while listening on ComfyUI's websocket as the canvas does. Every pack
   node that runs (not from ComfyUI's cache), the loaders and Encode Prompt aside, must move its
   progress bar, and those with a preview (the table in docs/comfyui.md) must send preview images,
   however short their run; each output file is opened and its frames counted, and
   Save's /history result must carry what the canvas shows (the mp4 as an animated entry). Every
   preview keeps its frame's size (ComfyUI scales a preview to its max size, up as well), and the
   samplers and Load Teacher Model show the settings they ran with, -1 resolved ("steps 4* ...").
   With --release NAME, the render workflow also runs with Load Flash Model on that Flash release
   folder in models/diffusion_models/ (which Load Flash Model must list).
6. cancel: on a freshly started server, the first render is interrupted in Load Flash Model and then in
   Encode Prompt (their first runs read the model and import the text encoder: seconds with no loop).
   Then a longer render (live-preview's physics world, 96 frames at 256x256, with a Save) and the
   teacher render are each timed once, then queued --cancel-runs times per pack node; when that node
   has run --interrupt-after seconds (half its run when shorter), POST /interrupt is sent and the
   seconds until ComfyUI reports the prompt interrupted, in that node, are printed, their median
   against the target (1 s). A node whose whole run is under 0.2 s is not timed. --busy-neighbour
   keeps one core busy (a spinning process) meanwhile, as a user's machine often is.
7. long clip (--long-clip PATH): the clip at each of --long-frames lengths (200 and 2,000) at 128x128 through
   Render G-Buffer Stream and through the render workflow's separate nodes, with the server's peak
   resident memory (VmHWM of its process, reset before each run); the stream node's must stay flat.
Prints one line per check, exits 1 if any failed. Not part of CI (ComfyUI is not installed there).
"""
from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import json
import struct
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAMES = 24
LONG = 1.0  # seconds: a single-step node (a loader) running longer is reported
MIN_CANCEL = 0.2  # seconds: a node's whole run shorter than this is not interrupted to time cancel
# pack nodes whose progress bar carries a preview frame (docs/comfyui.md); every other long node
# (Teacher Sampler, Save, ...) moves its bar without one; the loaders are single steps
PREVIEWS = {"AlayaFlash_PhysicsWorld", "AlayaFlash_LoadGBuffers", "AlayaFlash_LoadGBufferVideos",
            "AlayaFlash_RenderGBufferStream", "AlayaFlash_EncodeGBuffers", "AlayaFlash_FlashSampler",
            "AlayaFlash_Decode", "AlayaFlash_Refine", "AlayaFlash_StreamPreview"}
SINGLE_STEP = {"AlayaFlash_LoadFlashModel", "AlayaFlash_LoadTeacherModel", "AlayaFlash_EncodePrompt"}
CANCEL_ORDER = ["AlayaFlash_PhysicsWorld", "AlayaFlash_EncodeGBuffers", "AlayaFlash_FlashSampler", "AlayaFlash_Decode",
                "AlayaFlash_Refine", "AlayaFlash_Save", "AlayaFlash_StreamPreview"]
# the settings each node shows after a run, -1 resolved (its ui text: "steps 4* · chunk 1* ...")
SHOWN_SETTINGS = {"AlayaFlash_FlashSampler": ("steps", "chunk", "window", "sink"),
                  "AlayaFlash_RenderGBufferStream": ("steps", "chunk", "window", "sink"),
                  "AlayaFlash_TeacherSampler": ("steps", "CFG", "shift"), "AlayaFlash_LoadTeacherModel": ("window",)}
MODEL_WIDGETS = {"AlayaFlash_FlashSampler": ("steps", "chunk_frames", "window_frames", "sink_frames"),
                 "AlayaFlash_TeacherSampler": ("steps", "cfg", "shift"),
                 "AlayaFlash_LoadTeacherModel": ("window_frames",)}


def title(node: dict) -> str:
    return node.get("_meta", {}).get("title") or node["class_type"]


@dataclass
class Run:
    """What one queued prompt did, as seen on the websocket."""

    status: str = "timeout"  # success | error | interrupted | refused | timeout
    reply: dict = field(default_factory=dict)  # POST /prompt's answer (the errors when refused)
    error: dict = field(default_factory=dict)  # execution_error / execution_interrupted data
    order: list = field(default_factory=list)  # node ids in the order they ran
    cached: list = field(default_factory=list)  # node ids ComfyUI took from its cache
    seconds: dict = field(default_factory=dict)  # node id -> seconds it ran
    progress: Counter = field(default_factory=Counter)  # node id -> progress messages
    previews: Counter = field(default_factory=Counter)  # node id -> preview images
    preview_kind: dict = field(default_factory=dict)  # node id -> "image/jpeg 64x64" of its last preview
    interrupt_sent: bool = False
    cancel_latency: float | None = None  # seconds from POST /interrupt to the prompt's end (interrupted, or done)
    wall: float = 0.0
    prompt_id: str = ""


async def queue_prompt(http, server: str, api: dict, client_id: str = "") -> tuple[int, dict]:
    async with http.post(f"{server}/prompt", json={"prompt": api, "client_id": client_id}) as r:
        return r.status, await r.json(content_type=None)


async def run_prompt(http, server: str, api: dict, timeout: float, interrupt: tuple[str, float] | None = None) -> Run:
    """Queue `api` and follow it on /ws until it ends. interrupt=(node id, seconds): POST /interrupt once
    that node has run so long, and time how long until ComfyUI reports the prompt interrupted."""
    import aiohttp
    from PIL import Image

    run, client_id = Run(), uuid.uuid4().hex
    ws_url = server.replace("http", "ws", 1) + f"/ws?clientId={client_id}"
    async with http.ws_connect(ws_url, max_msg_size=0) as ws:
        # what the frontend says first: previews come with their node id (binary event 4)
        await ws.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
        inbox: asyncio.Queue = asyncio.Queue()

        async def read():
            async for msg in ws:
                inbox.put_nowait((time.monotonic(), msg))
            inbox.put_nowait((time.monotonic(), None))

        reader = asyncio.create_task(read())
        try:
            status, reply = await queue_prompt(http, server, api, client_id)
            run.reply = reply
            if status != 200:
                run.status = "refused"
                return run
            run.prompt_id = pid = reply["prompt_id"]
            t0 = time.monotonic()
            current, since, sent = None, t0, None
            while True:
                now = time.monotonic()
                wait = t0 + timeout - now
                if interrupt and sent is None and current == interrupt[0]:
                    wait = min(wait, since + interrupt[1] - now)
                if wait <= 0:
                    if time.monotonic() - t0 >= timeout:
                        break
                    async with http.post(f"{server}/interrupt") as r:
                        await r.read()
                    sent, run.interrupt_sent = time.monotonic(), True
                    continue
                try:
                    at, msg = await asyncio.wait_for(inbox.get(), wait)
                except asyncio.TimeoutError:
                    continue
                if msg is None:
                    break
                if msg.type == aiohttp.WSMsgType.BINARY:
                    (event,) = struct.unpack(">I", msg.data[:4])
                    if event == 4:  # PREVIEW_IMAGE_WITH_METADATA: length, JSON metadata, image
                        (n,) = struct.unpack(">I", msg.data[4:8])
                        meta = json.loads(msg.data[8:8 + n])
                        if meta.get("prompt_id") != pid:
                            continue
                        node = str(meta.get("display_node_id") or meta.get("node_id"))
                        size = Image.open(io.BytesIO(msg.data[8 + n:])).size
                        run.previews[node] += 1
                        run.preview_kind[node] = f"{meta.get('image_type', '?')} {size[0]}x{size[1]}"
                    continue
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                m = json.loads(msg.data)
                data = m.get("data") or {}
                if data.get("prompt_id") != pid:
                    continue
                kind = m["type"]
                if kind in ("executing", "execution_success", "execution_error", "execution_interrupted"):
                    if current is not None:
                        run.seconds[current] = run.seconds.get(current, 0.0) + at - since
                    current, since = (str(data["node"]) if kind == "executing" and data.get("node") is not None
                                      else None), at
                    if current is not None:
                        run.order.append(current)
                if kind == "progress":
                    run.progress[str(data["node"])] += 1
                elif kind == "execution_cached":
                    run.cached = [str(n) for n in data.get("nodes", [])]
                elif kind in ("execution_success", "execution_error", "execution_interrupted"):
                    run.status = kind.removeprefix("execution_")
                    run.error = data if kind != "execution_success" else {}
                    if sent is not None:  # the queue is free again: interrupted, or the prompt's last node had
                        run.cancel_latency = at - sent  # finished its work (ComfyUI checks only before a node)
                    break
            run.wall = time.monotonic() - t0
        finally:
            reader.cancel()
    return run


def small(name: str, api: dict) -> dict:
    """Shrink a workflow for a CPU server: the physics world at 64x64, 24 frames; outputs under alaya-flash-check/."""
    for node in api.values():
        inputs, kind = node["inputs"], node["class_type"]
        if kind == "AlayaFlash_PhysicsWorld":
            inputs.update(width=64, height=64, frames=FRAMES, objects=4)
        if kind in ("AlayaFlash_Save", "AlayaFlash_RenderGBufferStream"):
            stem = Path(inputs["filename"]).stem
            inputs.update(filename=f"alaya-flash-check/{name}-{stem}.mp4", overwrite=True)
        if kind == "AlayaFlash_StreamPreview":
            inputs.update(filename=f"alaya-flash-check/{name}-latest.jpg")
    return api


def frames_in(path: Path) -> int:
    import av

    with av.open(str(path)) as f:
        return sum(1 for _ in f.decode(video=0))


def frame_size(path: Path) -> tuple[int, int]:
    import av

    with av.open(str(path)) as f:
        stream = f.streams.video[0]
        return stream.codec_context.width, stream.codec_context.height


def shown_settings(api: dict, run: Run, hist: dict) -> tuple[list[str], list[str]]:
    """(problems, notes): each sampler (and teacher loader) that ran shows the settings it used."""
    import re

    problems, notes = [], []
    for nid in dict.fromkeys(run.order):
        labels = SHOWN_SETTINGS.get(api[nid]["class_type"])
        if not labels:
            continue
        text = " ".join((hist.get("outputs") or {}).get(nid, {}).get("text") or [])
        if all(re.search(rf"\b{label} [0-9.]+\*?", text) for label in labels):
            notes.append(f"{title(api[nid])} shows '{text}'")
        else:
            problems.append(f"{title(api[nid])} shows {text!r}, not its {', '.join(labels)}")
    return problems, notes


def preview_sizes(api: dict, run: Run, size: tuple[int, int]) -> list[str]:
    """Previews larger than the frames (ComfyUI scaling a small frame up to the preview's max size)."""
    out = []
    for nid, kind in run.preview_kind.items():
        w, h = (int(v) for v in kind.split()[-1].split("x"))
        if w > size[0] or h > size[1]:
            out.append(f"{title(api[nid]) if nid in api else nid} previews {w}x{h} for {size[0]}x{size[1]} frames")
    return out


def node_report(api: dict, run: Run) -> tuple[list[str], list[str]]:
    """(problems, one note per pack node that ran: seconds, progress messages, preview images). Every
    pack node but the single-step ones moves its bar, and those of PREVIEWS send preview images."""
    problems, notes = [], []
    for nid in dict.fromkeys(run.order):
        node, secs = api[nid], run.seconds.get(nid, 0.0)
        kind = node["class_type"]
        if not kind.startswith("AlayaFlash_"):
            continue
        steps, shown = run.progress[nid], run.previews[nid]
        if kind in SINGLE_STEP:
            if secs > LONG:
                notes.append(f"{title(node)} {secs:.1f} s")
            continue
        notes.append(f"{title(node)} {secs:.1f} s ({steps} progress, {shown} previews)")
        if not steps:
            problems.append(f"{title(node)} ran {secs:.1f} s without a progress message")
        if kind in PREVIEWS and not shown:
            problems.append(f"{title(node)} ran {secs:.1f} s without a preview image")
    return problems, notes


async def check_workflow(http, server: str, comfy: Path, name: str, api: dict, timeout: float, runs: dict) -> tuple[bool, str]:
    run = runs[name] = await run_prompt(http, server, api, timeout)
    if run.status != "success":
        detail = run.error.get("exception_message") or json.dumps(run.reply or run.error)[:400]
        return False, f"{run.status}: {detail.strip()[:400]}"
    problems, notes = node_report(api, run)
    hist, t0 = {}, time.monotonic()
    while not hist.get("status", {}).get("completed") and time.monotonic() - t0 < 30:  # /history is written
        async with http.get(f"{server}/history/{run.prompt_id}") as r:  # just after execution_success is sent
            hist = (await r.json()).get(run.prompt_id, {})
        await asyncio.sleep(0 if hist else 0.2)
    outs = []
    settings_problems, settings_notes = shown_settings(api, run, hist)
    problems += settings_problems
    notes += settings_notes
    for nid, node in api.items():
        if node["class_type"] not in ("AlayaFlash_Save", "AlayaFlash_StreamPreview", "AlayaFlash_RenderGBufferStream"):
            continue
        path = comfy / "output" / node["inputs"]["filename"]
        if not path.is_file():
            problems.append(f"{path} missing")
            continue
        shown = (hist.get("outputs") or {}).get(nid, {})
        if node["class_type"] in ("AlayaFlash_Save", "AlayaFlash_RenderGBufferStream"):
            want = {"filename": path.name, "subfolder": path.parent.relative_to(comfy / "output").as_posix(), "type": "output"}
            if shown.get("images") != [want] or shown.get("animated") != [True]:
                problems.append(f"{title(node)} {nid}: /history shows {json.dumps(shown)[:200]}, not the video {want}")
            outs.append(f"{path.relative_to(comfy)} ({frames_in(path)} frames, shown on the canvas)")
            problems += preview_sizes(api, run, frame_size(path))
        else:
            if not shown.get("images"):
                problems.append(f"{title(node)} {nid}: /history shows no last frame for the canvas")
            outs.append(f"{path.relative_to(comfy)} (newest frame; last frame shown on the canvas)")
    cached = [title(api[n]) for n in run.cached if n in api and api[n]["class_type"] not in SINGLE_STEP]
    notes += [f"from ComfyUI's cache: {', '.join(cached)}"] if cached else []
    detail = f"{run.wall:.1f} s -> " + ", ".join(outs) + ("; " + ", ".join(notes) if notes else "")
    return not problems, detail + ("; FAILED: " + "; ".join(problems) if problems else "")


def check_defaults(info: dict, classes: dict) -> tuple[bool, str]:
    """The model-owned widgets' defaults as /object_info gives them to the frontend."""
    problems, shown = [], []
    for kind, names in MODEL_WIDGETS.items():
        spec = {**info[kind]["input"].get("required", {}), **info[kind]["input"].get("optional", {})}
        for name in names:
            opts = spec[name][1] if name in spec and len(spec[name]) > 1 else {}
            if opts.get("default") != -1 or opts.get("min") != -1 or "model" not in opts.get("tooltip", ""):
                problems.append(f"{kind}.{name}: {json.dumps(opts)[:120]}")
        shown.append(f"{info[kind]['display_name']}: {', '.join(names)} = -1")
    for kind, cls in classes.items():  # every "auto" / "(from model)" widget of the node classes, as served
        local = {**cls.INPUT_TYPES().get("required", {}), **cls.INPUT_TYPES().get("optional", {})}
        served = {**info[kind]["input"].get("required", {}), **info[kind]["input"].get("optional", {})}
        for name, spec in local.items():
            want = spec[1].get("default") if len(spec) > 1 and isinstance(spec[1], dict) else None
            if want in ("auto", "(from model)"):
                got = served.get(name, [None, {}])
                got = got[1].get("default") if len(got) > 1 else None
                if got != want:
                    problems.append(f"{kind}.{name}: default {got!r}, want {want!r}")
                else:
                    shown.append(f"{kind.removeprefix('AlayaFlash_')}.{name} = {want}")
    return not problems, "; ".join(problems) if problems else "; ".join(shown)


async def check_validation(http, server: str) -> tuple[bool, str]:
    """A missing G-buffer path: exactly one error, on Load G-Buffers' path, in words an artist reads."""
    api = json.loads((ROOT / "workflows" / "api" / "render-gbuffer-sequence.json").read_text())
    load = next(k for k, n in api.items() if n["class_type"] == "AlayaFlash_LoadGBuffers")
    api[load]["inputs"]["path"] = "shots/no-such-shot"
    status, reply = await queue_prompt(http, server, small("validation", api))
    errors = [(nid, e) for nid, n in (reply.get("node_errors") or {}).items() for e in n.get("errors", [])]
    if status != 400 or len(errors) != 1:
        return False, f"POST /prompt -> {status} with {len(errors)} errors: {json.dumps(reply)[:600]}"
    nid, err = errors[0]
    said = f"{err['message']}: {err['details']}"
    good = (nid == load and err.get("extra_info", {}).get("input_name") == "path"
            and "G-buffer path 'shots/no-such-shot' not found" in err["details"])
    return good, f"one error on node {nid} ({title(api[nid])}), input path: {said}"


def rechunk(api: dict, chunk: int) -> dict:
    """The same workflow with another source chunk size: the same frames, but none of ComfyUI's cached outputs."""
    api = json.loads(json.dumps(api))
    for node in api.values():
        if node["class_type"] in ("AlayaFlash_PhysicsWorld", "AlayaFlash_LoadGBuffers", "AlayaFlash_LoadGBufferVideos",
                                  "AlayaFlash_RenderGBufferStream"):
            node["inputs"]["chunk"] = chunk
    return api


async def check_cancel(http, server: str, api: dict, kinds: list[str], after: float, timeout: float,
                       timing: Run | None = None, runs: int = 3) -> list[tuple[bool, str]]:
    """Per node of `kinds`: queue `api` `runs` times and POST /interrupt once that node has run `after` s
    (half its full run when shorter, as timed by `timing`, a finished run of the same graph); earlier
    nodes come from ComfyUI's cache on the next queue. The median latency must be within 1 s. A node
    whose full run is under MIN_CANCEL s is not timed."""
    if timing is None:
        timing = await run_prompt(http, server, rechunk(api, 15), timeout)
        if timing.status != "success":
            return [(False, f"timing run {timing.status}: {json.dumps(timing.error)[:300]}")]
    results, chunk = [], 11
    for nid in [k for kind in kinds for k, n in api.items() if n["class_type"] == kind]:
        name, full = title(api[nid]), timing.seconds.get(nid, 0.0)
        if full < MIN_CANCEL:
            results.append((True, f"{name}: its whole run takes {full:.2f} s, nothing to interrupt"))
            continue
        latencies, notes = [], []
        for _ in range(runs):
            chunk = chunk - 1 if chunk > 2 else 14  # another chunk size: the same frames, nothing cached
            run = await run_prompt(http, server, rechunk(api, chunk), timeout, interrupt=(nid, min(after, full / 2)))
            where = str(run.error.get("node_id"))
            if run.status == "success" and run.cancel_latency is not None and run.cancel_latency <= 0:
                notes.append(f"ran {run.seconds.get(nid, 0):.2f} s, done before the interrupt landed")
            elif run.status in ("interrupted", "success") and run.cancel_latency is not None:
                latencies.append(run.cancel_latency)
                if run.status == "success":
                    notes.append(f"the prompt ended {run.cancel_latency:.2f} s after POST /interrupt (its last node)")
                elif where != nid:
                    notes.append(f"stopped in {title(api[where]) if where in api else where}")
            elif run.status == "success" and not run.interrupt_sent:
                notes.append(f"ran {run.seconds.get(nid, 0):.2f} s, done before the interrupt")
            else:
                notes.append(f"not interrupted ({run.status}, ran {run.seconds.get(nid, 0):.1f} s) "
                             f"{json.dumps(run.error)[:160]}")
        if not latencies:
            good = all("done before" in n for n in notes)
            results.append((good, f"{name} (runs {full:.1f} s): " + "; ".join(notes)))
            continue
        median = statistics.median(latencies)
        results.append((median <= 1.0 and all("not interrupted" not in n for n in notes),
                        f"{name} (runs {full:.1f} s): stopped {median:.2f} s after POST /interrupt, median of "
                        f"{len(latencies)} ({', '.join(f'{x:.2f}' for x in latencies)})"
                        + (f"; {'; '.join(notes)}" if notes else "")))
    return results


async def check_first_cancel(http, server: str, timeout: float) -> list[tuple[bool, str]]:
    """On a freshly started server: interrupt the first render 0.5 s into Encode Prompt (its first run
    imports and reads the text encoder: seconds with no loop), then a render with Load Flash Model at
    another precision (not cached) 0.5 s into the loader."""
    api = small("first", json.loads((ROOT / "workflows" / "api" / "render-gbuffer-sequence.json").read_text()))
    out = []
    for kind in ("AlayaFlash_EncodePrompt", "AlayaFlash_LoadFlashModel"):
        nid = next(k for k, n in api.items() if n["class_type"] == kind)
        if kind == "AlayaFlash_LoadFlashModel":
            api[nid]["inputs"]["precision"] = "fp32"
        run = await run_prompt(http, server, api, timeout, interrupt=(nid, 0.5))
        if run.status == "interrupted" and run.cancel_latency is not None:
            out.append((run.cancel_latency <= 1.0, f"{title(api[nid])} (first run): stopped {run.cancel_latency:.2f} s "
                        "after POST /interrupt"))
        elif run.status == "success" and not run.interrupt_sent:
            out.append((True, f"{title(api[nid])} (first run): ran {run.seconds.get(nid, 0):.2f} s, under 0.5 s"
                        + ("" if nid in run.order else " (from ComfyUI's cache: not a fresh server)")))
        else:
            out.append((False, f"{title(api[nid])} (first run): {run.status} {json.dumps(run.error)[:200]}"))
    return out


def server_pid(server: str) -> int | None:
    """The ComfyUI process serving `server` on this machine (its main.py command line names the port)."""
    port = server.rsplit(":", 1)[-1].strip("/")
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"main.py") for a in args) and port.encode() in args:
            return int(proc.name)
    return None


def peak_rss(pid: int, reset: bool = False) -> float:
    """The process's peak resident memory (VmHWM) in MiB; reset: start a new peak from now (clear_refs 5)."""
    if reset:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024


def long_graphs(clip: Path, frames: int, size: int) -> dict[str, dict]:
    """The long clip through Render G-Buffer Stream (one node, chunk by chunk) and through the render
    workflow's separate nodes (each once over the whole clip), at size x size, writing mp4s."""
    out = {}
    for name, node in (("render-long-clip", "AlayaFlash_RenderGBufferStream"),
                       ("render-gbuffer-sequence", "AlayaFlash_LoadGBuffers")):
        api = small(f"long-{frames}", json.loads((ROOT / "workflows" / "api" / f"{name}.json").read_text()))
        src = next(n for n in api.values() if n["class_type"] == node)
        src["inputs"].update(path=str(clip.resolve()), frames=frames, width=size, height=size)
        out[name] = api
    return out


async def check_long_clip(http, server: str, comfy: Path, clip: Path, lengths: list[int], size: int,
                          timeout: float) -> list[tuple[bool, str]]:
    """The server's peak memory while a long clip renders, at each length, through Render G-Buffer Stream
    (it must stay flat: the longest clip's peak within 15 % of the shortest's) and through the render
    workflow's separate nodes (which hold the whole clip: their peak grows with it)."""
    pid = server_pid(server)
    if pid is None:
        return [(False, f"long clip: no ComfyUI process serving {server} on this machine (peak memory unreadable)")]
    peaks: dict[str, list[float]] = {}
    out = []
    for name in ("render-long-clip", "render-gbuffer-sequence"):  # the stream node's runs first, from one baseline
        for frames in lengths:
            api = long_graphs(clip, frames, size)[name]
            start = peak_rss(pid, reset=True)
            run = await run_prompt(http, server, api, timeout)
            peak = peak_rss(pid)
            saved = next(comfy / "output" / n["inputs"]["filename"] for n in api.values()
                         if n["class_type"] in ("AlayaFlash_Save", "AlayaFlash_RenderGBufferStream"))
            count = frames_in(saved) if run.status == "success" else 0
            peaks.setdefault(name, []).append(peak)
            out.append((run.status == "success" and count == frames,
                        f"long clip: {name} over {frames} frames at {size}x{size}: {run.status} in {run.wall:.0f} s, "
                        f"{count} frames written, server peak RSS {peak:.0f} MiB ({peak - start:+.0f} MiB over its "
                        f"{start:.0f} MiB at the start)"))
    flat = peaks.get("render-long-clip", [])
    if len(flat) > 1:
        out.append((flat[-1] <= 1.15 * flat[0], f"long clip: Render G-Buffer Stream's peak at {lengths[-1]} frames is "
                    f"{flat[-1] / flat[0]:.2f}x its peak at {lengths[0]} ({flat[0]:.0f} -> {flat[-1]:.0f} MiB)"))
    return out


def busy_neighbour():
    """A process that keeps one core busy (a user's machine running other work), or None."""
    import subprocess

    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def cancel_graph(frames: int) -> dict:
    """live-preview with a Save beside the Stream Preview: `frames` frames of the physics world at 256x256
    (the default model's size)."""
    api = json.loads((ROOT / "workflows" / "api" / "live-preview.json").read_text())
    refine = next(k for k, n in api.items() if n["class_type"] == "AlayaFlash_Refine")
    api["90"] = {"class_type": "AlayaFlash_Save", "_meta": {"title": "Save"},
                 "inputs": {"images": [refine, 0], "filename": "alaya-flash-check/cancel.mp4", "format": "mp4",
                            "fps": 16.0, "overwrite": True}}
    api = small("cancel", api)
    for node in api.values():
        if node["class_type"] == "AlayaFlash_PhysicsWorld":
            node["inputs"].update(frames=frames, width=256, height=256, seed=7)
    return api


async def main_async(args) -> int:
    import aiohttp

    sys.path.insert(0, str(ROOT / "tests"))
    import conftest  # noqa: F401  (imports this checkout as alaya_flash)
    from alaya_flash.nodes import NODE_CLASS_MAPPINGS

    ok = True

    def say(good: bool, text: str):
        nonlocal ok
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} {text}", flush=True)

    server = args.server.rstrip("/")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as http:
        async with http.get(f"{server}/system_stats") as r:
            system = (await r.json())["system"]
        print(f"ComfyUI {system.get('comfyui_version')}, torch {system.get('pytorch_version')}, "
              f"Python {system.get('python_version', '').split()[0]}, {' '.join(system.get('argv', [])[1:])}")
        async with http.get(f"{server}/object_info") as r:
            info = await r.json()
        missing = sorted(set(NODE_CLASS_MAPPINGS) - set(info))
        say(not missing, f"nodes: /object_info lists {len(NODE_CLASS_MAPPINGS) - len(missing)}/{len(NODE_CLASS_MAPPINGS)} "
                         f"alaya-flash nodes" + (f"; missing: {', '.join(missing)}" if missing else ""))
        if missing:
            return 1
        say(*(lambda g, d: (g, f"defaults: {d}"))(*check_defaults(info, NODE_CLASS_MAPPINGS)))
        async with http.get(f"{server}/extensions") as r:
            scripts = [u for u in await r.json() if u.endswith("/stream_preview.js")]
        say(len(scripts) == 1, f"web extension: /extensions lists {scripts} (the frontend loads each once)")
        async with http.get(f"{server}/api/workflow_templates") as r:
            templates = await r.json()
        listed = [name for k, v in templates.items() if "alaya" in k.lower() for name in v]
        want = sorted(p.stem for p in (ROOT / "workflows").glob("*.json"))
        say(sorted(listed) == want, f"templates: /api/workflow_templates lists {sorted(listed)} (want {want})")
        say(*(lambda g, d: (g, f"thumbnails: {d}"))(*await check_thumbnails(http, server, templates)))
        say(*(lambda g, d: (g, f"validation: {d}"))(*await check_validation(http, server)))
        neighbour = busy_neighbour() if args.busy_neighbour else None
        try:
            if not args.no_cancel:
                for good, detail in await check_first_cancel(http, server, args.timeout):
                    say(good, f"cancel: {detail}")
            await checks_after_start(http, server, args, info, say)
        finally:
            if neighbour is not None:
                neighbour.kill()
                neighbour.wait()
    return 0 if ok else 1


async def check_thumbnails(http, server: str, templates: dict) -> tuple[bool, str]:
    """Each of the pack's templates has its thumbnail where the template browser asks for it."""
    got, bad = [], []
    for pack, names in templates.items():
        if "alaya" not in pack.lower():
            continue
        for name in names:
            async with http.get(f"{server}/api/workflow_templates/{pack}/{name}.jpg") as r:
                body = await r.read()
                kind = r.headers.get("Content-Type", "")
            (got if r.status == 200 and kind == "image/jpeg" and body[:2] == b"\xff\xd8" else bad).append(
                f"{name}.jpg ({r.status} {kind}, {len(body) // 1024} KB)")
    return not bad and bool(got), ", ".join(got + bad) + (f"; FAILED: {', '.join(bad)}" if bad else "")


async def checks_after_start(http, server: str, args, info: dict, say) -> None:
    """The workflows, the release and the cancel checks (after those that need a fresh server)."""
    runs: dict = {}
    for path in sorted((ROOT / "workflows" / "api").glob("*.json")):
        name = path.stem
        if args.no_workflows or (args.only and name not in args.only):
            continue
        good, detail = await check_workflow(http, server, args.comfyui, name, small(name, json.loads(path.read_text())),
                                            args.timeout, runs)
        say(good, f"{name}: {detail}")
    if args.release:  # a Flash release folder in models/diffusion_models/ (docs/model.md, "The Flash release")
        api = small("release", json.loads((ROOT / "workflows" / "api" / "render-gbuffer-sequence.json").read_text()))
        loader = next(k for k, n in api.items() if n["class_type"] == "AlayaFlash_LoadFlashModel")
        api[loader]["inputs"]["model"] = args.release
        listed = args.release in info["AlayaFlash_LoadFlashModel"]["input"]["required"]["model"][0]
        good, detail = await check_workflow(http, server, args.comfyui, "release", api, args.timeout, runs)
        say(listed and good, f"release {args.release!r} (listed by Load Flash Model: {listed}): {detail}")
    if args.long_clip:
        for good, detail in await check_long_clip(http, server, args.comfyui, args.long_clip, args.long_frames,
                                                  args.long_size, args.timeout):
            say(good, detail)
    if args.no_cancel:
        return
    if args.long_clip:  # the stream node's cancel, 1 s into a long clip
        api = long_graphs(args.long_clip, args.long_frames[0], args.long_size)["render-long-clip"]
        for good, detail in await check_cancel(http, server, api, ["AlayaFlash_RenderGBufferStream"],
                                               args.interrupt_after, args.timeout, runs=args.cancel_runs):
            say(good, f"cancel: {detail}")
    api = cancel_graph(args.cancel_frames)
    for good, detail in await check_cancel(http, server, api, CANCEL_ORDER, args.interrupt_after, args.timeout,
                                           runs=args.cancel_runs):
        say(good, f"cancel: {detail}")
    if args.no_teacher:
        return
    teacher = small("render-teacher", json.loads((ROOT / "workflows" / "api" / "render-teacher.json").read_text()))
    kinds = ["AlayaFlash_EncodeGBuffers", "AlayaFlash_TeacherSampler", "AlayaFlash_Decode", "AlayaFlash_Save"]
    for good, detail in await check_cancel(http, server, teacher, kinds, args.interrupt_after, args.timeout,
                                           timing=runs.get("render-teacher"), runs=args.cancel_runs):
        say(good, f"cancel: {detail}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="http://127.0.0.1:8188", help="ComfyUI server URL")
    p.add_argument("--comfyui", type=Path, default=Path("/work/comfyui"), help="ComfyUI folder (for its output/)")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for each prompt")
    p.add_argument("--only", nargs="*", help="run only these workflows (names in workflows/)")
    p.add_argument("--release", help="also render with this Flash release folder (its name under models/diffusion_models/)")
    p.add_argument("--no-cancel", action="store_true", help="skip the cancel checks")
    p.add_argument("--cancel-frames", type=int, default=96, help="physics-world frames of the cancel render (256x256)")
    p.add_argument("--interrupt-after", type=float, default=1.0, help="seconds a node runs before POST /interrupt")
    p.add_argument("--cancel-runs", type=int, default=3, help="interrupted runs per node (their median is checked)")
    p.add_argument("--no-teacher", action="store_true", help="skip the teacher render's cancel checks")
    p.add_argument("--no-workflows", action="store_true", help="skip running the saved workflows")
    p.add_argument("--long-clip", type=Path, help="a G-buffer clip of at least the longest --long-frames frames: "
                   "the server's peak memory while it renders through Render G-Buffer Stream and the separate nodes")
    p.add_argument("--long-frames", type=int, nargs="+", default=[200, 2000], help="clip lengths for --long-clip")
    p.add_argument("--long-size", type=int, default=128, help="frame side for --long-clip")
    p.add_argument("--busy-neighbour", action="store_true",
                   help="keep one core busy (a spinning process) during the runs, as a user's machine often is")
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
