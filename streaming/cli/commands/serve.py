"""Serve the live preview page: watch and steer a stream as it renders, in the browser.

  alaya-flash serve                                  # playable physics world, http://127.0.0.1:8765/
  alaya-flash serve --gbuffers clips/seed3 --source file --prompt "a rainy street"
  alaya-flash serve --workflow workflows/api/live-preview.json
  alaya-flash serve --record --record-gbuffers       # record from the start
  alaya-flash serve --model MODEL --light "sunset_dramatic,az=90,el=15"   # a light-reading model under a given light

The page shows the rendered stream (and, on request, the G-buffer passes), a prompt box, the
lighting presets, the sun's sliders (a model whose refiner reads the light renders under them), FPS /
latency / dropped-frame readouts, start / pause / reset, the source choice and a record button. In the physics world the keyboard moves the player and the camera
(WASD, arrows, Q/E, Space, F). The server binds 127.0.0.1 unless --host says otherwise.
Ctrl-C, SIGTERM and SIGHUP stop it and finish an open recording (a renderer error does not:
Start or Reset on the page tries again). An external engine renders through the same server with
`alaya_flash.client` (/engine: its own session on the same weights; --max-sessions bounds them;
a dropped connection is resumed within --resume-grace seconds).
docs/live.md describes the page, the protocols and the limits.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .. import args as args_
from ..args import parse_size

HELP = "serve the live preview page (playable physics world or a looped G-buffer file)"


def serve_token(host: str, token: str | None) -> str | None:
    """--token, or a fresh one when the page is served beyond this machine (--host not loopback)."""
    import secrets

    from ....model_zoo.errors import AlayaError
    from ...live.server import LOOPBACK_NAMES

    if token is not None:
        if len(token) < 8 or not token.isprintable() or any(c in token for c in " &#?%"):
            raise AlayaError("--token: use at least 8 printable characters, none of space & # ? %")
        return token
    return None if host.strip("[]").lower() in LOOPBACK_NAMES else secrets.token_urlsafe(16)


def _preset_names():
    from ...world.shading import PRESETS

    return PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind; anything but 127.0.0.1 exposes the page to your network. "
                        "Requests must name the server in their Host header (localhost, an IP address, this "
                        "value, or with 0.0.0.0 this machine's name): others get 403 (DNS rebinding)")
    parser.add_argument("--token", help="a secret every request must carry (?token=... in the printed address); "
                        "with a --host other than loopback one is generated when not given")
    parser.add_argument("--port", type=args_.bounded(int, 0, 65535), default=8765, help="TCP port (0: any free port)")
    parser.add_argument("--source", choices=("world", "file"), default="world",
                        help="initial source: the playable physics world or the --gbuffers file stream")
    parser.add_argument("--gbuffers", type=Path, help="G-buffer stream for the 'file' source (any layout "
                        "`alaya-flash gbuffers info` reads); looped")
    parser.add_argument("--size", type=parse_size, default=(256, 256), metavar="N|WxH",
                        help="render size: N for NxN or WIDTHxHEIGHT, multiples of 16")
    parser.add_argument("--fps", type=args_.FPS, default=30.0, help="stream frame rate (physics steps 1/fps per frame)")
    parser.add_argument("--seed", type=args_.SEED, default=0, help="world seed and sampler seed")
    parser.add_argument("--preset", choices=args_.LazyChoices(_preset_names), default="bright_sunny", metavar="PRESET",
                        help="initial lighting preset (its prompt is the initial prompt): %(choices)s")
    parser.add_argument("--prompt", default="", help="initial prompt (overrides the preset's)")
    args_.add_light_argument(parser, "; every session starts under it (the page's sun sliders and an engine's "
                             "light messages change it mid-stream); a model whose refiner does not read the light "
                             "refuses it")
    parser.add_argument("--model", type=args_.model_path, help=args_.SHIPPED_MODEL_HELP + "; default: the embedded default model")
    parser.add_argument("--random-model", action="store_true",
                        help="use tiny random weights (no model needed; shows the plumbing, not pictures)")
    parser.add_argument("--workflow", type=Path, help="API-format workflow to render with instead of the "
                        "standard Flash pipeline (its G-buffer source is fed from the page's source)")
    parser.add_argument("--chunk-latents", type=args_.bounded(int, 1, 64), default=None,
                        help="latent frames per autoregressive chunk (default: the model's; 1 = 4 frames, lowest latency)")
    parser.add_argument("--steps", type=args_.STEPS, default=None, help="sampling steps per chunk (default: the model's)")
    parser.add_argument("--no-refiner", action="store_true",
                        help="leave out the model's G-buffer refiner: faster, softer frames (the tiny decoder's)")
    parser.add_argument("--device", default="cpu", help="torch device for the model, e.g. cpu or cuda")
    parser.add_argument("--jpeg-quality", type=int, default=85, help="JPEG quality of the streamed frames (10..100)")
    parser.add_argument("--record", action="store_true", help="record from the start (the page can start/stop it)")
    parser.add_argument("--record-dir", type=Path, default=Path("recordings"),
                        help="folder that receives one live-YYYYmmdd-HHMMSS folder per recording")
    parser.add_argument("--record-gbuffers", action="store_true",
                        help="record the G-buffers too (the teacher's lossless {mod}.mp4 layout) besides RGB")
    parser.add_argument("--paused", action="store_true", help="start paused (press Start on the page)")
    parser.add_argument("--max-sessions", type=args_.bounded(int, 1, 64), default=None,
                        help="render sessions at once, the page's stream included (default 4): engines connecting to "
                        "/engine (alaya_flash.client) each get their own stream on the same loaded weights")
    parser.add_argument("--resume-grace", type=args_.bounded(float, 0, 3600), default=None, metavar="SECONDS",
                        help="keep an engine session whose connection dropped this long (default 30) for "
                        "alaya_flash.client to resume it: its stream state, prompt and unanswered frames wait, and it "
                        "counts as a session; 0: a drop ends the session")
    parser.add_argument("--no-webrtc", action="store_true",
                        help="send the page's video as JPEG over the WebSocket only (WebRTC needs the webrtc extra: aiortc)")
    args_.add_cpu_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import sys

    from ....model_zoo.errors import AlayaError
    from ...live.page_session import LiveConfig, PageSession
    from ...live.renderers import renderer_factory
    from ...live.server import MAX_SESSIONS, RESUME_GRACE, LiveServer

    height, width = args.size
    if args.workflow is not None and args.no_refiner:
        raise AlayaError("--no-refiner: a --workflow renders with its own nodes; take its Refine node out instead")
    if args.gbuffers is not None:
        from ...files.readers import open_gbuffers

        open_gbuffers(args.gbuffers)  # fail now, with the reader's message, not inside the renderer
    if not 0 <= args.port <= 65535:
        raise AlayaError(f"--port {args.port} is out of range 0..65535")
    config = LiveConfig(width=width, height=height, fps=args.fps, seed=args.seed, prompt=args.prompt,
                        preset=args.preset, source=args.source, gbuffers=args.gbuffers,
                        jpeg_quality=args.jpeg_quality, record_dir=args.record_dir, record=args.record,
                        record_gbuffers=args.record_gbuffers, autostart=not args.paused).validate()
    node_classes = None
    if args.workflow is not None:
        from .run import node_classes as lookup

        node_classes = lookup()
    make_renderer = renderer_factory(model=args.model, workflow=args.workflow, random_model=args.random_model,
                                     seed=args.seed, fps=args.fps, device=args.device,
                                     chunk_latents=args.chunk_latents, steps=args.steps, node_classes=node_classes,
                                     refine=not args.no_refiner, light=args.light)
    token = serve_token(args.host, args.token)
    server = LiveServer(lambda hub: PageSession(make_renderer, config, hub), host=args.host, port=args.port,
                        make_renderer=make_renderer, max_sessions=args.max_sessions or MAX_SESSIONS,
                        use_webrtc=not args.no_webrtc, token=token,
                        resume_grace=RESUME_GRACE if args.resume_grace is None else args.resume_grace)

    def ready(url: str) -> None:
        video = "WebRTC or JPEG" if server.webrtc_reason is None else f"JPEG (no WebRTC: {server.webrtc_reason})"
        address = f"{url}?token={token}" if token else url
        print(f"alaya-flash live: {address}  video: {video}  (Ctrl-C stops)", file=sys.stderr, flush=True)

    server.serve_forever(on_ready=ready)
    return 0
