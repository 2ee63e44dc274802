"""Check, on a running ComfyUI, that the live-preview workflow streams preview frames to the canvas.

    cd /work/comfyui && .venv/bin/python main.py --cpu --listen 127.0.0.1 --port 8190 --disable-auto-launch
    .venv/bin/python integrations/comfyui/comfyui_live_check.py --url http://127.0.0.1:8190 --frames 25 --size 64

Queues workflows/api/live-preview.json (with the Physics World source shortened to --frames at
--size) with a client_id, listens on ComfyUI's /ws as the canvas does, and counts what arrives
while it runs: `progress` messages per node and binary preview images (event 1 = JPEG/PNG preview,
what the frontend draws on the executing node). Prints one summary line per node and exits 0 when
previews arrived and the prompt finished, 1 otherwise. Not part of the test suite (ComfyUI is
not installable in CI).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def check(url: str, frames: int, size: int, timeout: float) -> int:
    import aiohttp

    wf = json.loads((ROOT / "workflows" / "api" / "live-preview.json").read_text())
    src = next(n for n in wf.values() if n["class_type"] == "AlayaFlash_PhysicsWorld")
    src["inputs"].update(frames=frames, width=size, height=size)
    client_id = uuid.uuid4().hex
    progress, previews, formats = Counter(), Counter(), Counter()
    last_node, status = None, "timeout"
    async with aiohttp.ClientSession() as s, s.ws_connect(f"{url}/ws?clientId={client_id}", max_msg_size=0) as ws:
        async with s.post(f"{url}/prompt", json={"prompt": wf, "client_id": client_id}) as r:
            body = await r.json()
            if r.status != 200:
                print(f"queue refused: {r.status} {json.dumps(body)[:400]}")
                return 1
            prompt_id = body["prompt_id"]
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            msg = await ws.receive(timeout=timeout)
            if msg.type == aiohttp.WSMsgType.BINARY:
                event, kind = struct.unpack(">II", msg.data[:8])
                previews[(event, last_node)] += 1
                formats["JPEG" if msg.data[8:11] == b"\xff\xd8\xff" else "PNG" if msg.data[9:12] == b"PNG" else "?"] += 1
            elif msg.type == aiohttp.WSMsgType.TEXT:
                m = json.loads(msg.data)
                data = m.get("data", {})
                if data.get("prompt_id") not in (None, prompt_id):
                    continue
                if m["type"] == "progress":
                    progress[data["node"]] += 1
                    last_node = data["node"]
                elif m["type"] == "executing" and data.get("node"):
                    last_node = data["node"]
                elif m["type"] in ("execution_success", "execution_error", "execution_interrupted"):
                    status = m["type"]
                    if m["type"] == "execution_error":
                        print("error:", data.get("exception_message"))
                    break
            else:
                break
        seconds = time.monotonic() - t0
    titles = {nid: n.get("_meta", {}).get("title", n["class_type"]) for nid, n in wf.items()}
    print(f"{status} after {seconds:.1f} s ({frames} frames at {size}x{size})")
    for nid in sorted(progress, key=str):
        n_prev = sum(v for (ev, node), v in previews.items() if node == nid)
        print(f"  node {nid} ({titles.get(str(nid), '?')}): {progress[nid]} progress updates, {n_prev} preview images")
    print(f"  preview formats: {dict(formats)}")
    return 0 if status == "execution_success" and sum(previews.values()) > 0 else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8188", help="ComfyUI server address")
    p.add_argument("--frames", type=int, default=25, help="frames the Physics World source renders")
    p.add_argument("--size", type=int, default=64, help="frame size (square)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the run")
    args = p.parse_args(argv)
    return asyncio.run(check(args.url.rstrip("/"), args.frames, args.size, args.timeout))


if __name__ == "__main__":
    sys.exit(main())
