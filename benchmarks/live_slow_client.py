"""Does a client that reads nothing slow the live renderer or grow its memory? Figures, no asserts.

    .venv/bin/python benchmarks/live_slow_client.py                 # 30 s per phase, 256x256
    .venv/bin/python benchmarks/live_slow_client.py --seconds 10 --size 128 --flash

The server runs in this process (127.0.0.1, any free port) with the physics world as source.
Phase A: one client reads every frame. Phase B: the same, plus a client that completes the
WebSocket handshake and then never reads (a raw socket with a 4 KiB receive buffer, so the
kernel's buffers fill and the server's writes to it stall). Phase C repeats A after the stalled
client left (A vs C shows the machine's drift). Printed per phase: the
renderer's frames/s (frames handed out / wall time), the reading client's frames/s, the
process RSS at the start and end, and the stalled client's dropped-frame count and pending
payloads. --fps sets the pacing target (default 120: the renderer runs as fast as it can, so
any stall would show). The default renderer is the transport tests' tint renderer (cheap, so the
figures are about transport); --flash uses the tiny random Flash model.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from _common import ROOT, rss_mib

sys.path.insert(0, str(ROOT / "tests"))


async def read_for(url: str, seconds: float) -> int:
    import aiohttp

    n = 0
    async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                msg = await ws.receive(timeout=max(0.05, end - time.monotonic()))
            except asyncio.TimeoutError:
                break
            n += msg.type == aiohttp.WSMsgType.BINARY
    return n


def phase(server, seconds: float, label: str, stalled=None) -> dict:
    page = server.page
    rss0, f0, t0 = rss_mib(), page.emitted, time.perf_counter()
    received = asyncio.run(read_for(server.url, seconds))
    dt = time.perf_counter() - t0
    row = {"phase": label, "renderer_fps": (page.emitted - f0) / dt, "reader_fps": received / dt,
           "rss_start_mib": rss0, "rss_end_mib": rss_mib()}
    if stalled is not None:
        slow = list(server.hub.clients)  # the reader has disconnected: only the stalled one is left
        row["stalled_sent"] = max((c.sent for c in slow), default=0)
        row["stalled_dropped"] = max((c.dropped for c in slow), default=0)
        row["stalled_pending"] = max((c.pending() for c in slow), default=0)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    p.add_argument("--size", type=int, default=256, help="frame size (square, multiple of 16)")
    p.add_argument("--fps", type=float, default=120.0, help="pacing target of the renderer")
    p.add_argument("--flash", action="store_true", help="render with the tiny random Flash model")
    args = p.parse_args(argv)

    from live_helpers import TintRenderer, stalled_client, start_server

    renderer = TintRenderer
    if args.flash:
        from alaya_flash.streaming.live.renderers import renderer_factory

        renderer = renderer_factory(random_model=True, chunk_latents=1, fps=args.fps)
    server = start_server(renderer=renderer, width=args.size, height=args.size, fps=args.fps)
    try:
        server.page.ready.wait(120)
        time.sleep(2.0)  # warm-up
        rows = [phase(server, args.seconds, "A: one reading client")]
        sock = stalled_client(server.url)
        rows.append(phase(server, args.seconds, "B: + a client that reads nothing", stalled=sock))
        sock.close()
        time.sleep(1.0)
        rows.append(phase(server, args.seconds, "C: one reading client again (stalled one gone)"))
    finally:
        server.stop()
    print(f"live renderer, {args.size}x{args.size}, renderer {'tiny random Flash' if args.flash else 'tint'}, "
          f"{args.seconds:g} s per phase, {os.cpu_count()} CPUs")
    for r in rows:
        extra = (f", stalled client: {r['stalled_sent']} frames sent (into socket buffers), {r['stalled_dropped']} "
                 f"dropped, {r['stalled_pending']} payloads pending"
                 if "stalled_dropped" in r else "")
        print(f"{r['phase']}: renderer {r['renderer_fps']:.1f} FPS, reader {r['reader_fps']:.1f} FPS, "
              f"RSS {r['rss_start_mib']:.0f} -> {r['rss_end_mib']:.0f} MiB{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
