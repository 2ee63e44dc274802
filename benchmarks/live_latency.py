"""Live latency: engine send -> rendered frame received (the client), capture -> display (the page),
and each session's FPS. Figures, no asserts.

    .venv/bin/python benchmarks/live_latency.py                      # default model, 256x256, 1 and 2 engines
    .venv/bin/python benchmarks/live_latency.py --sessions 1 --fps 4 # engines sending 4 frames/s
    .venv/bin/python benchmarks/live_latency.py --no-refiner --sessions 1 2
    .venv/bin/python benchmarks/live_latency.py --sessions 1 --backends torch openvino --repeat 3
    .venv/bin/python benchmarks/live_latency.py --transport          # pass-through renderer: the socket alone
    .venv/bin/python benchmarks/live_latency.py --browser            # capture -> display in Debian's chromium
    .venv/bin/python benchmarks/live_latency.py --browser --video webrtc   # the same over WebRTC (aiortc)

Engines: the server is `alaya-flash serve --paused` in its own process (the page's stream is
paused, so only the engines render, unless --world; --model, --size, --no-refiner, --chunk-latents
go to it), one server per --backends entry in turn, --repeat times (rows in the order run). Each
engine is an AsyncClient in this process sending physics-world G-buffers (teacher form, rendered
once beforehand) as frame 0, 1, 2, ...: either closed-loop, keeping --window frames in flight
(default 4, one chunk of the default model: the next chunk goes out as the last comes back, the
lowest latency at the highest rate the renderer sustains), or paced at --fps frames/s. The first
--warmup frames are not counted; a few frames past --frames complete the last chunk. Printed per
run: round trip p50 / p99 (send -> received, time.perf_counter in this process), the server's
part p50 (received -> sent back: waiting for the chunk to fill, for the shared weights, the
render) and what is left (the socket both ways, packing and parsing), each engine's FPS (and with
--world the page stream's, from the status).

--transport: a server whose renderer returns each frame's albedo at once (one-frame chunks), at
256x256 and 1024x1024, so the round trip is the WebSocket path alone: what a same-machine
shared-memory path could save at most.

--browser: `alaya-flash serve` (the physics world running, the default model) and Debian's
chromium on the page for --seconds; the page measures each frame from its capture (the wall-clock
time carried in the frame header) to the next paint after it is drawn (window.alaya.displayMs).
--video webrtc: the page's WebRTC video instead of JPEG over the WebSocket (the default here, so
the figure stays comparable); the frame's capture time comes on the data channel, matched to the
displayed frame by RTP timestamp, taken at the video frame callback.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time

import numpy as np

from _common import ROOT, import_package

CLI = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
       "from alaya_flash.streaming.cli import main; sys.exit(main())"]


def start(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    """Start a server process; returns it and the URL it prints ("... http://127.0.0.1:PORT/ ...")."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        if "http://" in line:
            url = next(w for w in line.split() if w.startswith("http://"))
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return proc, url
    raise SystemExit(f"the server did not start: {proc.wait()}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def world_frames(size: int, n: int = 48) -> list[np.ndarray]:
    """n physics-world frames in teacher form (the ball rolling forward), rendered once."""
    from alaya_flash.streaming.gbuffer import frame_to_teacher
    from alaya_flash.streaming.world.play import Controls, PlayableWorld
    from alaya_flash.streaming.world.world import WorldConfig

    game = PlayableWorld(WorldConfig(seed=3, width=size, height=size, fps=30.0, presets=()))
    try:
        return [frame_to_teacher(game.step(Controls(move=(0.0, 1.0))), game.info.depth_near) for _ in range(n)]
    finally:
        game.close()


async def engine(url: str, frames: list[np.ndarray], count: int, warmup: int, window: int, fps: float) -> dict:
    """One engine session: send count + padding frames, collect the first count back."""
    from alaya_flash.client import AsyncClient

    total, pad = warmup + count, 16
    got, sent = [], 0
    changed, more = asyncio.Event(), asyncio.Event()
    async with AsyncClient(url, timeout=600) as client:
        async def receive():
            while len(got) < total:
                while client.renderable() <= len(got):  # (the client refuses to wait for a chunk not all sent)
                    more.clear()
                    await more.wait()
                got.append(await client.receive(timeout=600))
                changed.set()

        reader = asyncio.ensure_future(receive())
        t0 = time.perf_counter()
        for n in range(total + pad):
            if fps:
                await asyncio.sleep(max(0.0, t0 + n / fps - time.perf_counter()))
            else:
                while sent - len(got) >= window and not reader.done():
                    changed.clear()
                    await changed.wait()
            if reader.done():
                break
            await client.send(n, frames[n % len(frames)])
            sent += 1
            more.set()
        await reader
        status = client.status
    measured = got[warmup:]
    span = measured[-1].received - measured[0].received
    return {"rtt": [f.round_trip_ms for f in measured], "server": [f.timings["server_ms"] for f in measured],
            "render": [f.timings["render_ms"] for f in measured], "turn": [f.timings["turn_ms"] for f in measured],
            "fps": (len(measured) - 1) / span if span > 0 else 0.0, "server_fps": status.get("fps"),
            "world_fps": next((x["fps"] for x in status.get("sessions", []) if x["session"] == 0), None)}


def pct(values, q) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def report(label: str, runs: list[dict]) -> dict:
    rtt = [v for r in runs for v in r["rtt"]]
    server = [v for r in runs for v in r["server"]]
    rest = [a - b for r in runs for a, b in zip(r["rtt"], r["server"])]
    row = {"run": label, "frames": len(rtt), "rtt_p50": pct(rtt, 50), "rtt_p99": pct(rtt, 99),
           "server_p50": pct(server, 50), "render_p50": pct([v for r in runs for v in r["render"]], 50),
           "turn_p50": pct([v for r in runs for v in r["turn"]], 50), "socket_p50": pct(rest, 50),
           "fps": [round(r["fps"], 2) for r in runs], "world_fps": runs[-1]["world_fps"]}
    print(f"{label}: {row['frames']} frames, round trip p50 {row['rtt_p50']:.1f} ms, p99 {row['rtt_p99']:.1f} ms; "
          f"server p50 {row['server_p50']:.1f} ms (chunk render {row['render_p50']:.1f}, waiting for the weights "
          f"{row['turn_p50']:.1f}); socket and parsing p50 {row['socket_p50']:.2f} ms; FPS per engine {row['fps']}"
          + (f"; the page's world stream {row['world_fps']} FPS" if row["world_fps"] else ""), flush=True)
    return row


def run_engines(url: str, frames, sessions: int, args) -> list[dict]:
    async def main():
        return await asyncio.gather(*[engine(url, frames, args.frames, args.warmup, args.window, args.fps)
                                      for _ in range(sessions)])

    return asyncio.run(main())


class PassThrough:
    """A renderer that returns each frame's albedo at once: the round trip is the transport alone."""

    chunk_frames = 1

    def reset(self): ...

    def set_prompt(self, text): ...

    def render(self, chunk):
        return np.ascontiguousarray(chunk[:, 0])


def passthrough_server(size: int) -> None:
    """Serve /engine with PassThrough (a --transport child process); prints the URL, runs until killed."""
    from alaya_flash.streaming.live.page_session import LiveConfig, PageSession
    from alaya_flash.streaming.live.server import LiveServer

    cfg = LiveConfig(width=64, height=64, autostart=False)
    server = LiveServer(lambda hub: PageSession(PassThrough, cfg, hub), port=0, make_renderer=PassThrough)
    server.serve_forever(on_ready=lambda url: print(f"pass-through server: {url}", file=sys.stderr, flush=True))


def browser(args) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from browser_helpers import chromium

    import tempfile

    cmd = CLI + ["serve", "--port", "0", "--size", str(args.size)] + server_options(args)
    proc, url = start(cmd)
    try:
        with tempfile.TemporaryDirectory() as profile:
            driver = chromium(profile)
            try:
                driver.get(f"{url}?video={args.video}")
                deadline = time.monotonic() + 600
                while not driver.execute_script("return window.alaya.frames > 8") and time.monotonic() < deadline:
                    time.sleep(0.5)
                driver.execute_script("window.alaya.displayMs.length = 0")
                time.sleep(args.seconds)
                shown = driver.execute_script("return window.alaya.displayMs.slice()")
                status = driver.execute_script("return window.alaya.status")
                video = driver.execute_script("return window.alaya.video")
            finally:
                driver.quit()
    finally:
        stop(proc)
    row = {"run": f"browser {video}", "frames": len(shown), "display_p50": pct(shown, 50), "display_p99": pct(shown, 99),
           "server_fps": status.get("fps"), "handout_latency_p50": status.get("latency_ms")}
    print(f"browser ({video}): {len(shown)} frames, capture -> display p50 {row['display_p50']:.1f} ms, p99 "
          f"{row['display_p99']:.1f} ms; capture -> handed out p50 {row['handout_latency_p50']} ms; "
          f"renderer {row['server_fps']} FPS", flush=True)
    return row


def server_options(args) -> list[str]:
    out = ["--model", args.model] if args.model else []
    out += ["--no-refiner"] if args.no_refiner else []
    out += ["--chunk-latents", str(args.chunk_latents)] if args.chunk_latents else []
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256, help="frame size (square, multiple of 16)")
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 2], help="engines at once, one run each")
    p.add_argument("--frames", type=int, default=96, help="frames counted per engine")
    p.add_argument("--warmup", type=int, default=9, help="frames sent first and not counted")
    p.add_argument("--window", type=int, default=4, help="closed loop: frames an engine keeps in flight")
    p.add_argument("--fps", type=float, default=0.0, help="pace each engine's sends at this rate (0: closed loop)")
    p.add_argument("--model", help="Flash model folder (default: the embedded default model)")
    p.add_argument("--no-refiner", action="store_true")
    p.add_argument("--chunk-latents", type=int)
    p.add_argument("--world", action="store_true", help="keep the page's physics-world stream running beside the engines")
    p.add_argument("--transport", action="store_true", help="pass-through renderer at 256 and 1024: the socket alone")
    p.add_argument("--browser", action="store_true", help="capture -> display in chromium instead")
    p.add_argument("--seconds", type=float, default=30.0, help="--browser: how long to watch")
    p.add_argument("--video", choices=("jpeg", "webrtc"), default="jpeg", help="--browser: the page's video transport")
    p.add_argument("--backends", nargs="+", choices=("torch", "openvino"), default=["torch"],
                   help="the server's --backend, one server each in turn")
    p.add_argument("--repeat", type=int, default=1, help="run the backends in turn this many times")
    p.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    p.add_argument("--passthrough-server", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import_package()
    if args.passthrough_server:
        passthrough_server(args.passthrough_server)
        return 0
    rows = []
    if args.browser:
        rows.append(browser(args))
    elif args.transport:
        for size in (256, 1024):
            proc, url = start([sys.executable, __file__, "--passthrough-server", str(size)])
            try:
                rng = np.random.default_rng(0)
                frames = [rng.integers(0, 256, (5, size, size, 3), dtype=np.uint8) for _ in range(4)]
                one = argparse.Namespace(**{**vars(args), "window": 1})  # one frame at a time: no queueing
                rows.append(report(f"transport {size}x{size}, 1 engine", run_engines(url, frames, 1, one)))
            finally:
                stop(proc)
    else:
        frames = world_frames(args.size)
        for _ in range(args.repeat):
            for backend in args.backends:  # (the tests' conftest, imported by CLI, pins auto to torch)
                proc, url = start(CLI + ["serve"] + ([] if args.world else ["--paused"])
                                  + ["--port", "0", "--size", str(args.size), "--max-sessions", str(1 + max(args.sessions)),
                                     "--backend", backend] + server_options(args))
                try:
                    for n in args.sessions:
                        how = f"paced at {args.fps:g} frames/s" if args.fps else f"closed loop, {args.window} in flight"
                        how += ", beside the page's world stream" if args.world else ""
                        rows.append(report(f"{backend}, {args.size}x{args.size}, {n} engine(s), {how}",
                                           run_engines(url, frames, n, args)))
                finally:
                    stop(proc)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
