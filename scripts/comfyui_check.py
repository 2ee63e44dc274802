"""Check the pack against a running ComfyUI server: nodes listed, templates, workflows, results, cancel.

    cd /work/comfyui && .venv/bin/python main.py --cpu --listen 127.0.0.1 --port 8188 --disable-auto-launch &
    .venv/bin/python scripts/comfyui_check.py --comfyui /work/comfyui --server http://127.0.0.1:8188

1. GET /object_info: every node id of NODE_CLASS_MAPPINGS is there (the pack imported cleanly).
2. GET /api/workflow_templates lists the pack's example_workflows/.
3. Each workflows/*.api.json is queued through POST /prompt as shipped (the bundled samples/courtyard
   clip, the embedded default model; the physics world shrunk to 64x64 so a CPU server finishes
   quickly; outputs under output/alaya-flash-check/), /history is polled until it finishes, the
   output file is opened and its frames counted, and Save's result in /history carries what the
   canvas shows (an mp4 as an animated entry).
4. Cancel: a long physics-world stream is queued, POST /interrupt is sent once it renders, and the
   seconds until the prompt ends interrupted are printed (target: within 1 s).
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


def small(name: str, api: dict) -> dict:
    """Shrink a workflow for a CPU server: the physics world at 64x64, 24 frames; outputs under alaya-flash-check/."""
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
            for nid, node in api.items():
                if node["class_type"] == "AlayaFlash_Save":
                    path = comfy / "output" / node["inputs"]["filename"]
                    if not path.is_file():
                        return False, f"{path} missing"
                    shown = (hist.get("outputs") or {}).get(nid, {})
                    if not shown.get("images") or shown.get("animated") != [True]:
                        return False, f"Save node {nid}: /history shows no video for the canvas ({json.dumps(shown)[:200]})"
                    outs.append(f"{path.relative_to(comfy)} ({frames_in(path)} frames, shown on the canvas)")
                if node["class_type"] == "AlayaFlash_StreamPreview":
                    path = comfy / "output" / node["inputs"]["filename"]
                    if not path.is_file():
                        return False, f"{path} missing"
                    outs.append(f"{path.relative_to(comfy)} (latest frame)")
            return True, f"{time.time() - t0:.1f} s -> " + ", ".join(outs)
        time.sleep(1)
    return False, f"no result after {timeout:.0f} s"


def check_cancel(server: str, timeout: float) -> tuple[bool, str]:
    """Queue a long stream, interrupt it once it renders, time how long until it stops."""
    api = json.loads((ROOT / "workflows" / "live-preview.api.json").read_text())
    for node in api.values():
        if node["class_type"] == "AlayaFlash_PhysicsWorld":
            node["inputs"].update(width=128, height=128, frames=100_000)
    status, reply = post(server, "/prompt", {"prompt": api, "client_id": str(uuid.uuid4())})
    if status != 200:
        return False, f"POST /prompt -> {status}: {json.dumps(reply)[:400]}"
    pid = reply["prompt_id"]
    t0 = time.time()
    while not get(server, "/queue").get("queue_running"):
        if time.time() - t0 > timeout:
            return False, "the stream never started"
        time.sleep(0.2)
    time.sleep(10)  # well inside the stream: models loaded, frames rendering
    sent = time.time()
    post(server, "/interrupt", {})
    while time.time() - sent < 60:
        hist = get(server, f"/history/{pid}").get(pid)
        if hist and hist.get("status", {}).get("completed") is not None:
            took = time.time() - sent
            return took <= 1.0, f"stopped {took:.2f} s after POST /interrupt ({hist['status'].get('status_str')})"
        time.sleep(0.05)
    return False, "still running 60 s after POST /interrupt"


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
    templates = get(args.server, "/api/workflow_templates")
    listed = next((v for k, v in templates.items() if "alaya" in k.lower()), [])
    want = sorted(p.stem for p in (ROOT / "example_workflows").glob("*.json"))
    good = sorted(listed) == want
    ok &= good
    print(f"{'PASS' if good else 'FAIL'} /api/workflow_templates lists {sorted(listed)} (want {want})")
    for path in sorted((ROOT / "workflows").glob("*.api.json")):
        name = path.name[: -len(".api.json")]
        good, detail = run_workflow(args.server, args.comfyui, name, small(name, json.loads(path.read_text())), args.timeout)
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} {name}: {detail}", flush=True)
    good, detail = check_cancel(args.server, args.timeout)
    ok &= good
    print(f"{'PASS' if good else 'FAIL'} cancel: {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
