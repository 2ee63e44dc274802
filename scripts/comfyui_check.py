"""Check the pack against a running ComfyUI server: nodes listed, API workflows run to output files.

    cd /work/comfyui && .venv/bin/python main.py --cpu --listen 127.0.0.1 --port 8188 --disable-auto-launch &
    .venv/bin/python scripts/comfyui_check.py --comfyui /work/comfyui --server http://127.0.0.1:8188

1. GET /object_info: every node id of NODE_CLASS_MAPPINGS is there (the pack imported cleanly).
2. A generated 24-frame G-buffer clip is written to ComfyUI's input folder (input/gbuffers/clip).
3. Each workflows/*.api.json is queued through POST /prompt (small sizes and frame counts so a CPU
   server finishes quickly; outputs under output/alaya-flash-check/), /history is polled until it
   finishes, and the output file is opened and its frames counted.
Prints one line per check and exits 1 if any failed. Not part of CI (ComfyUI is not installed there).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAMES = 24


def get(server: str, path: str):
    with urllib.request.urlopen(server + path, timeout=30) as r:
        return json.loads(r.read())


def post(server: str, path: str, body: dict):
    req = urllib.request.Request(server + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def make_clip(comfy: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    import conftest  # noqa: F401  (imports this checkout as alaya_flash)
    from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    out = comfy / "input" / "gbuffers" / "clip"
    write_stream(synthetic_stream(64, 64, FRAMES, seed=3), NpyWindowSink(out, window=16, overwrite=True))
    return out


def small(name: str, api: dict) -> dict:
    """Shrink a workflow for a CPU server: 64x64, 24 frames (sources), outputs under alaya-flash-check/."""
    for node in api.values():
        inputs, kind = node["inputs"], node["class_type"]
        if kind == "AlayaFlash_PhysicsWorld":
            inputs.update(width=64, height=64, frames=FRAMES, objects=4)
        if kind == "AlayaFlash_Save":
            stem = Path(inputs["filename"]).stem
            inputs.update(filename=f"alaya-flash-check/{name}-{stem}.mp4", overwrite=True)
        if kind == "AlayaFlash_StreamPreview":
            inputs.update(filename=f"alaya-flash-check/{name}-latest.jpg")
    return api


def frames_in(path: Path) -> int:
    import av

    with av.open(str(path)) as f:
        return sum(1 for _ in f.decode(video=0))


def run_workflow(server: str, comfy: Path, name: str, api: dict, timeout: float) -> tuple[bool, str]:
    status, reply = post(server, "/prompt", {"prompt": api, "client_id": str(uuid.uuid4())})
    if status != 200:
        return False, f"POST /prompt -> {status}: {json.dumps(reply)[:400]}"
    pid, t0 = reply["prompt_id"], time.time()
    while time.time() - t0 < timeout:
        hist = get(server, f"/history/{pid}").get(pid)
        if hist and hist.get("status", {}).get("completed") is not None and (hist["status"]["completed"] or hist["status"].get("status_str") == "error"):
            if hist["status"].get("status_str") != "success":
                msgs = [m for m in hist["status"].get("messages", []) if m[0] == "execution_error"]
                detail = msgs[0][1].get("exception_message", "")[:300] if msgs else ""
                return False, f"execution {hist['status'].get('status_str')}: {detail}"
            outs = []
            for node in api.values():
                if node["class_type"] == "AlayaFlash_Save":
                    path = comfy / "output" / node["inputs"]["filename"]
                    if not path.is_file():
                        return False, f"{path} missing"
                    outs.append(f"{path.relative_to(comfy)} ({frames_in(path)} frames)")
                if node["class_type"] == "AlayaFlash_StreamPreview":
                    path = comfy / "output" / node["inputs"]["filename"]
                    if not path.is_file():
                        return False, f"{path} missing"
                    outs.append(f"{path.relative_to(comfy)} (latest frame)")
            return True, f"{time.time() - t0:.1f} s -> " + ", ".join(outs)
        time.sleep(1)
    return False, f"no result after {timeout:.0f} s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="http://127.0.0.1:8188", help="ComfyUI server URL")
    p.add_argument("--comfyui", type=Path, default=Path("/work/comfyui"), help="ComfyUI folder (for input/ and output/)")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for each workflow")
    args = p.parse_args(argv)
    ok = True
    sys.path.insert(0, str(ROOT / "tests"))
    import conftest  # noqa: F401
    from alaya_flash.nodes import NODE_CLASS_MAPPINGS

    info = get(args.server, "/object_info")
    missing = sorted(set(NODE_CLASS_MAPPINGS) - set(info))
    ok &= not missing
    print(f"{'PASS' if not missing else 'FAIL'} /object_info lists {len(NODE_CLASS_MAPPINGS) - len(missing)}/{len(NODE_CLASS_MAPPINGS)} "
          f"alaya-flash nodes" + (f"; missing: {', '.join(missing)}" if missing else ""))
    make_clip(args.comfyui)
    for path in sorted((ROOT / "workflows").glob("*.api.json")):
        name = path.name[: -len(".api.json")]
        good, detail = run_workflow(args.server, args.comfyui, name, small(name, json.loads(path.read_text())), args.timeout)
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} {name}: {detail}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
