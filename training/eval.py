"""The evaluation harness behind `alaya-flash eval`: held-out clips rendered by a Flash model and its
teacher, scored on the content, temporal, cross-window, control, runtime, lighting and long-stream
axes (streaming/cli/commands/eval.py describes each; the frame metrics are streaming/metrics.py)."""
from __future__ import annotations

import math
import resource
import sys
import time


def _clips(args, size):
    """[held-out clip dicts], preset names, prompt wordings per preset.

    A clip: "gbuffers" uint8 (T,5,H,W,3), "rgb" uint8 (P,T,H,W,3) in `names` order and, from a world v2
    dataset, "captions" (P,) (its training wording per preset: scene and sun side), "sun_visibility"
    uint8 (P,T,H,W) and "ground" bool (T,H,W) (the lighting axis)."""
    import numpy as np

    from ..model_zoo.errors import AlayaError
    from .data import ClipSet, DataConfig, render_clip
    from .prompts import prompts as wordings
    from ..streaming.world.shading import PRESETS

    split = getattr(args, "split", "heldout")
    if split != "heldout" and args.data is None:
        raise AlayaError(f"--split {split} needs --data (clips rendered now are held-out seeds)")
    held = ClipSet(args.data, split) if args.data is not None else None
    table = held.presets if held is not None and held.meta.get("world") == "pathtrace" else list(PRESETS)
    names = list(table) if args.presets == "all" else [p.strip() for p in args.presets.split(",") if p.strip()]
    for n in names:
        if n not in table:
            raise AlayaError(f"--presets: {n!r} is unknown; choose from {', '.join(table)}")
    if len(names) < 2:
        raise AlayaError("--presets: prompt controllability needs at least two presets")
    if held is not None:
        idx = [held.presets.index(n) for n in names if n in held.presets]
        if len(idx) != len(names):
            raise AlayaError(f"{args.data}: the dataset lacks some of the presets {', '.join(names)}")
        clips = []
        for c in range(min(args.clips, len(held))):
            clip = {"gbuffers": held.gbuffers[c], "rgb": held.rgb[c][idx]}
            if held.light is not None:  # each preset's light per frame (P, T, PACKED)
                clip["light"] = held.light[c][idx]
            if held.captions is not None:
                clip["captions"] = [held.captions[c][i] for i in idx]
            file = held.meta["clips"][split][c]
            info = held.meta.get("clip_info", {}).get(file)
            if info is not None:  # world v2: its scene kind and sun side, for the caption naming the other side
                clip["scene"], clip["sun_side"] = info["scene"], info["sun_side"]
            if held.sky_visibility is not None:  # the sky pass (clips made since 2026-12-08), already read
                clip["sky_visibility"] = held.sky_visibility[c]
            with np.load(held.root / file) as z:
                if "sun_visibility" in z and "ground" in z:
                    clip["sun_visibility"], clip["ground"] = z["sun_visibility"][idx], z["ground"]
                if "truth_noise_mse" in z:  # the path-traced truth's own noise (data config heldout_passes)
                    clip["truth_noise_mse"] = z["truth_noise_mse"][idx]
            clips.append(clip)
    else:
        h, w = size
        cfg = DataConfig(width=w, height=h, frames=args.frames, presets=tuple(names), train_clips=1,
                         heldout_clips=args.clips).validate()
        clips = []
        for k in range(args.clips):
            d = render_clip(cfg, cfg.heldout_seed + k)
            clips.append({"gbuffers": d["gbuffers"], "rgb": d["rgb"], "light": d["light"]})
    keep = getattr(args, "heldout_wordings", 0) or None
    if keep is not None and keep < 0:
        raise AlayaError(f"--heldout-wordings {keep}: give a count >= 1, or 0 for all")
    # "heldout": the first paraphrase; "heldout_all": those eval scores
    return clips, names, {n: {"train": wordings(n, "train")[0], "heldout": wordings(n, "heldout")[0],
                              "heldout_all": wordings(n, "heldout")[:keep]} for n in names}


def _render(pipeline, gbuffers, chunk: int = 4, passes: dict | None = None):
    """Stream G-buffers through a pipeline in chunks of `chunk` frames: (frames (T,H,W,3), seconds, first-frame s).
    passes: the clip's light passes by name (GBuffers' "shadow", "sky": (T, H, W) uint8)."""
    import torch

    from ..streaming.values import GBuffers

    def piece(a):
        return GBuffers(torch.from_numpy(gbuffers[a:a + chunk]), **{k: v[a:a + chunk] for k, v in (passes or {}).items()})

    outs, first = [], None
    t0 = time.perf_counter()
    for out in pipeline.run(piece(a) for a in range(0, len(gbuffers), chunk)):
        outs.append(out)
        first = first if first is not None else time.perf_counter() - t0
    return torch.cat(outs), time.perf_counter() - t0, first


def _shown_path(path) -> str:
    """A model folder as a report names it: relative to the working directory when inside it, so a
    report made in the repository does not carry this machine's path."""
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def control_record(out, gt: list, p: int, names: list[str], clip: int) -> tuple[float, float, str | None]:
    """Prompt control of one render prompted with preset p: hit (1.0 / 0.0), margin in dB, and the
    miss as the report writes it (None on a hit)."""
    from ..streaming import metrics

    near = metrics.nearest(out, gt, p)
    miss = None if near["hit"] else f"clip {clip}: {names[p]} -> {names[near['nearest']]} ({near['margin_db']:+.2f} dB)"
    return float(near["hit"]), near["margin_db"], miss


def _mean(values):
    values = [v for v in values if v is not None and not math.isinf(v)]
    return sum(values) / len(values) if values else None


SHADOW_TOLERANCE = 0.2  # issue #32's target: a render's shadow ratio within 20% of its truth's


def other_side(render, out, truth, gbuffers, sun_visibility, clip: dict, preset: str) -> dict:
    """The same clip rendered (render: wording -> frames) with its caption naming the opposite sun side
    (left <-> right, ahead <-> behind): how far that moves the render (PSNR between the two; inf: not at
    all) and the shadow ratio of the moved render on the truth's shadowed ground (a model that follows
    the caption darkens the truth's shadows less when told the sun is on the other side)."""
    from ..streaming import metrics
    from ..streaming.world.traced.presets import OPPOSITE_SIDE, TRACED_PRESETS, caption

    moved = render(caption(TRACED_PRESETS[preset], clip["scene"], OPPOSITE_SIDE[clip["sun_side"]]))
    return {"side_move_db": metrics.psnr(out, moved),
            "opposite_shadow_ratio": metrics.lighting(moved, truth, gbuffers, sun_visibility, clip["ground"])["shadow_ratio"]}


def lighting_summary(records: list[dict]) -> dict:
    """The lighting axis from metrics.lighting's records (one per training-wording render)."""
    shadows = [(r["shadow_ratio"], r["gt_shadow_ratio"]) for r in records if r["shadow_ratio"] is not None]
    errors = [abs(a - b) / b for a, b in shadows if b > 0]
    metal = [r for r in records if r["metal_contrast"] is not None]
    sky = [r["sky_error_levels"] for r in records if r["sky_error_levels"] is not None]
    sided = [r for r in records if "side_move_db" in r]  # rendered again with the opposite sun side named
    pairs = [r for r in sided if r["shadow_ratio"] is not None and r["opposite_shadow_ratio"] is not None]
    return {"shadows": {"renders": len(shadows), "ratio": _mean([a for a, _ in shadows]),
                        "gt_ratio": _mean([b for _, b in shadows]), "relative_error": _mean(errors),
                        "within_tolerance": _mean([float(e <= SHADOW_TOLERANCE) for e in errors]),
                        "tolerance": SHADOW_TOLERANCE},
            "metal": {"renders": len(metal), "contrast": _mean([r["metal_contrast"] for r in metal]),
                      "gt_contrast": _mean([r["gt_metal_contrast"] for r in metal]),
                      "psnr_db": _mean([r["metal_psnr_db"] for r in metal])},
            "sky": {"renders": len(sky), "error_levels": _mean(sky)},
            "sun_side": {"renders": len(sided), "pairs": len(pairs), "move_db": _mean([r["side_move_db"] for r in sided]),
                         "shadow_ratio": _mean([r["shadow_ratio"] for r in pairs]),
                         "opposite_shadow_ratio": _mean([r["opposite_shadow_ratio"] for r in pairs]),
                         "follows_rate": _mean([float(r["shadow_ratio"] < r["opposite_shadow_ratio"]) for r in pairs])}}


def evaluate(args) -> dict:
    import torch

    from ..model_zoo import bundle, folders, runtime
    from ..streaming import metrics
    from ..model_zoo.errors import AlayaError
    from ..streaming.render.lighting import Shade, model_prior, recorded
    from ..streaming.render.pipelines import FlashPipeline, TeacherPipeline
    from ..streaming.values import GBuffers, PromptSchedule, latent_start_pixel
    from ..streaming.world.traced.presets import TRACED_PRESETS

    if not args.no_long_stream:
        check_long_stream(args.long_frames, args.long_block, args.long_size)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    flash = runtime.accelerate(folders.load_flash(args.model, dtype=dtype))  # the process's --backend
    teacher = None
    if not args.no_teacher:
        tdir = args.teacher or (flash.path / "teacher" if flash.path else None)
        if tdir is not None and (args.teacher is not None or tdir.is_dir()):
            teacher = bundle.load_teacher(tdir, dtype=dtype)
    size = args.size or flash.trained_size or (128, 128)
    clips, names, prompts = _clips(args, size)
    text = flash.text_encoder()
    negative = text([teacher.settings.negative_prompt if teacher else ""])
    models = {"student": flash, **({"teacher": teacher} if teacher else {})}
    scores = {m: {"psnr": [], "psnr_noise_free": [], "truth_noise_psnr": [], "psnr_by_latent": [], "psnr_by_scale": [],
                  "ssim": [],
                  "diff_error": [], "temporal_ratio": [], "boundary_ratio": [], "gt_boundary_ratio": [],
                  "hit_train": [], "margin_train": [], "hit_heldout": [], "margin_heldout": [],
                  "miss_train": [], "miss_heldout": [], "hit_by_paraphrase": {}, "psnr_by_preset": {},
                  "psnr_by_paraphrase": {}, "heldout_psnr_by_preset": {}, "psnr_by_clip": {},
                  "fps": [], "first_frame_s": [], "lighting": []} for m in models}
    vs_teacher = {"psnr": [], "ssim": []}

    light_from = getattr(args, "light", "prompt")
    if light_from == "data" and "light" not in clips[0]:
        raise AlayaError(f"--light data: {args.data} records no lights (made before clips carried them): make it again")
    shadows_from = getattr(args, "shadows", "screen")
    if shadows_from == "pass" and "sun_visibility" not in clips[0]:
        raise AlayaError(f"--shadows pass: {args.data or 'a physics-world clip'} records no sun visibility "
                         "(only world v2 data does)")
    sky_from = getattr(args, "sky", "screen")
    if sky_from == "pass" and "sky_visibility" not in clips[0]:
        raise AlayaError(f"--sky pass: {args.data or 'a physics-world clip'} records no sky visibility "
                         "(world v2 data made since 2026-12-08 does)")

    def render(m: str, wording: str, gbuffers, light=None, passes=None):
        """(frames, seconds, first-frame seconds) of model m prompted with `wording`; light: the frames'
        packed lights (T, PACKED) for --light data; passes: the light passes for --shadows / --sky pass."""
        sched = PromptSchedule.encode(text, wording)
        if m == "student":
            lights = recorded(light) if light_from == "data" else None
            return _render(FlashPipeline(flash, sched, seed=args.seed, refine=not args.no_refiner, lights=lights), gbuffers,
                           passes=passes)
        return _render(TeacherPipeline(teacher, sched, negative, seed=args.seed, steps=args.teacher_steps), gbuffers)

    from tqdm import tqdm

    # one tick per render: clips x presets x (training wording, held-out paraphrases) x models
    per_preset = 1 + len(prompts[names[0]]["heldout_all"])
    bar = tqdm(total=len(clips) * len(names) * per_preset * len(models), desc="eval", unit="render", file=sys.stderr,
               disable=getattr(args, "quiet", False) or not sys.stderr.isatty())
    prior_psnr: dict[str, list[float]] = {}  # the shading prior alone under --light's light, per preset
    prior_by_clip: dict[int, list[float]] = {}
    shade_with = prior_only(text, model_prior(flash))
    for c, clip in enumerate(clips):
        gb, rgb = clip["gbuffers"], clip["rgb"]
        gt = [torch.from_numpy(rgb[p]).float() / 255 for p in range(len(names))]
        frames = gb.shape[0]
        cf = flash.settings.chunk_frames
        bounds = {"student": sorted({latent_start_pixel(k) for k in range(cf, frames, cf)} - {0}),
                  "teacher": list(range(teacher.settings.window_frames, frames, teacher.settings.window_frames)) if teacher else []}
        for p, name in enumerate(names):
            # a world v2 clip's training wording is its caption: the preset's prompt about its scene, naming the sun's side
            wordings = [("train", 0, clip["captions"][p] if "captions" in clip else prompts[name]["train"])]
            wordings += [("heldout", i, w) for i, w in enumerate(prompts[name]["heldout_all"])]
            light = clip["light"][p] if light_from == "data" else None
            passes = {}
            if shadows_from == "pass":
                passes["shadow"] = clip["sun_visibility"][p]
            if sky_from == "pass":
                passes["sky"] = clip["sky_visibility"]
            shaded = GBuffers(torch.as_tensor(gb), **passes)
            prior = Shade(recorded(light), shade_with.prior).step(shaded) if light is not None else shade_with(wordings[0][2], shaded)
            prior_psnr.setdefault(name, []).append(metrics.psnr(prior, gt[p]))
            prior_by_clip.setdefault(c, []).append(prior_psnr[name][-1])
            for kind, index, wording in wordings:
                renders = {}
                for m in models:
                    out, secs, first = render(m, wording, gb, light, passes)
                    bar.set_postfix_str(f"clip {c}, {name}, {m}")
                    bar.update()
                    renders[m] = out
                    s = scores[m]
                    s["fps"].append(frames / secs)
                    s["first_frame_s"].append(first)
                    hit, margin, miss = control_record(out, gt, p, names, c)
                    s[f"hit_{kind}"].append(hit)
                    s[f"margin_{kind}"].append(margin)
                    if kind == "heldout":  # what a user's own wording gets: control, and the picture's PSNR
                        s["hit_by_paraphrase"].setdefault(index, []).append(hit)
                        psnr = metrics.psnr(out, gt[p])
                        s["psnr_by_paraphrase"].setdefault(index, []).append(psnr)
                        s["heldout_psnr_by_preset"].setdefault(name, []).append(psnr)
                    if miss:
                        s[f"miss_{kind}"].append(miss if kind == "train" else f"{miss} [paraphrase {index + 1}]")
                    if kind == "train":
                        s["psnr"].append(metrics.psnr(out, gt[p]))
                        s["psnr_by_preset"].setdefault(name, []).append(s["psnr"][-1])
                        s["psnr_by_clip"].setdefault(c, []).append(s["psnr"][-1])
                        if "truth_noise_mse" in clip:
                            noise = float(clip["truth_noise_mse"][p].mean()) / 255 ** 2
                            s["truth_noise_psnr"].append(10 * math.log10(1 / noise))
                            s["psnr_noise_free"].append(metrics.noise_free_psnr(out, gt[p], noise))
                        s["psnr_by_latent"].append(metrics.psnr_by_latent(out, gt[p]))
                        s["psnr_by_scale"].append(metrics.psnr_by_scale(out, gt[p]))
                        s["ssim"].append(metrics.ssim(out, gt[p]))
                        t = metrics.temporal(out, gt[p])
                        s["diff_error"].append(t["diff_error"])
                        s["temporal_ratio"].append(t["ratio"])
                        s["boundary_ratio"].append(metrics.boundary_ratio(out, bounds[m]))
                        s["gt_boundary_ratio"].append(metrics.boundary_ratio(gt[p], bounds[m]))
                        if "sun_visibility" in clip:
                            sunlit = TRACED_PRESETS[name].light is not None  # the presets whose caption names a sun side
                            vis = clip["sun_visibility"][p] if sunlit else None
                            record = metrics.lighting(out, gt[p], gb, vis, clip["ground"])
                            if sunlit and "sun_side" in clip:
                                record.update(other_side(lambda w: render(m, w, gb, light, passes)[0], out, gt[p], gb, vis,
                                                         clip, name))
                            s["lighting"].append(record)
                if kind == "train" and "teacher" in renders:
                    vs_teacher["psnr"].append(metrics.psnr(renders["student"], renders["teacher"]))
                    vs_teacher["ssim"].append(metrics.ssim(renders["student"], renders["teacher"]))
    bar.close()
    first = clips[0]["gbuffers"]
    report = {"setup": {"clips": len(clips), "frames": int(first.shape[0]), "size": list(first.shape[2:4]),
                        "presets": names, "source": str(args.data) if args.data else "rendered held-out seeds",
                        "split": args.split,
                        "world": "pathtrace" if "sun_visibility" in clips[0] else "physics",
                        "training_wording": "each clip's caption" if "captions" in clips[0] else "the preset's first",
                        "light": light_from, "shadows": shadows_from, "sky": sky_from, "student_steps": flash.settings.steps, "chunk_frames": flash.settings.chunk_frames,
                        "teacher_steps": (args.teacher_steps or teacher.settings.steps) if teacher else None,
                        "teacher_cfg": teacher.settings.cfg if teacher else None, "precision": args.precision,
                        **({"scenes": [clip["scene"] for clip in clips]} if all("scene" in clip for clip in clips) else {}),
                        "model": _shown_path(flash.path), "refiner": flash.refiner is not None and not args.no_refiner,
                        "text_encoder": flash.text_encoder_name, "torch_threads": torch.get_num_threads()}}
    for m, s in scores.items():
        report[m] = {
            "content": {"psnr_db": _mean(s["psnr"]), "ssim": _mean(s["ssim"]),
                        "psnr_db_by_latent": [_mean(column) for column in zip(*s["psnr_by_latent"])],
                        "psnr_db_truth_coarser_than": {str(k): _mean([r[k] for r in s["psnr_by_scale"]])
                                                       for k in metrics.SCALES},
                        "psnr_db_by_preset": {name: _mean(v) for name, v in s["psnr_by_preset"].items()},
                        "psnr_db_by_clip": [_mean(v) for _, v in sorted(s["psnr_by_clip"].items())],
                        "heldout_wordings": {
                            "psnr_db": _mean([v for vs in s["psnr_by_paraphrase"].values() for v in vs]),
                            "psnr_db_by_paraphrase": [_mean(v) for _, v in sorted(s["psnr_by_paraphrase"].items())],
                            "psnr_db_by_preset": {name: _mean(v) for name, v in s["heldout_psnr_by_preset"].items()}}},
            "temporal": {"diff_error": _mean(s["diff_error"]), "ratio": _mean(s["temporal_ratio"])},
            "cross_window": {"ratio": _mean(s["boundary_ratio"]), "gt_ratio": _mean(s["gt_boundary_ratio"])},
            "control": {f"{kind}_wordings": {"nearest_rate": _mean(s[f"hit_{kind}"]), "margin_db": _mean(s[f"margin_{kind}"]),
                                             "misses": s[f"miss_{kind}"]} for kind in ("train", "heldout")},
            "runtime_eval_size": {"fps": _mean(s["fps"]), "first_frame_s": _mean(s["first_frame_s"])},
        }
        if s["psnr_noise_free"]:  # world v2 truths of several passes: their own noise, and PSNR against the noise-free truth
            report[m]["content"]["truth_noise"] = {"truth_psnr_db": _mean(s["truth_noise_psnr"]),
                                                   "psnr_db_noise_free": _mean(s["psnr_noise_free"])}
        if s["lighting"]:
            report[m]["lighting"] = lighting_summary(s["lighting"])
        report[m]["control"]["heldout_wordings"]["nearest_rate_by_paraphrase"] = [
            _mean(h) for _, h in sorted(s["hit_by_paraphrase"].items())]
    if vs_teacher["psnr"]:
        report["student"]["content"]["vs_teacher"] = {"psnr_db": _mean(vs_teacher["psnr"]), "ssim": _mean(vs_teacher["ssim"])}
    report["student"]["runtime"] = _runtime(flash, text, args)
    report["prior_only"] = {"psnr_db": _mean([v for vs in prior_psnr.values() for v in vs]),
                            "psnr_db_by_preset": {n: _mean(v) for n, v in prior_psnr.items()},
                            "psnr_db_by_clip": [_mean(v) for _, v in sorted(prior_by_clip.items())],
                            "light": "each clip's recorded light" if light_from == "data"
                            else "the light head's reading of each training wording (or caption)",
                            "reflections": shade_with.prior.config.reflections}  # the model's own prior
    report["light_head"] = light_head_scores()
    if not args.no_long_stream:
        kind = args.long_world if args.long_world != "auto" else "v2" if report["setup"]["world"] == "pathtrace" else "physics"
        report["student"]["long_stream"] = long_stream(flash, text, args.long_frames, args.long_block, args.long_size,
                                                       seed=args.seed, refine=not args.no_refiner,
                                                       quiet=getattr(args, "quiet", False), world_kind=kind,
                                                       world_light=light_from == "data")
    report["peak_memory_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return report


def prior_only(text_encoder, prior=None):
    """wording, GBuffers (or uint8 (T, 5, H, W, 3)) -> the shading prior's frames (T, H, W, 3) under the light the
    shipped light head reads from the wording: eval's no-network baseline (what `alaya-flash shade` renders).
    `prior`: the ShadingPrior to shade with (default: the plain one), also the returned function's `.prior`."""
    import torch

    from ..model_zoo import light_head
    from ..model_zoo.bundle import load_text_encoder
    from ..model_zoo.text_encoder import MINILM
    from ..model_zoo.shading_prior import ShadingPrior
    from ..streaming.render.lighting import LightSchedule, Shade
    from ..streaming.values import GBuffers

    head = light_head.load()
    reader = text_encoder if hasattr(text_encoder, "states") else load_text_encoder(MINILM)

    def shade(wording: str, gbuffers) -> "torch.Tensor":
        g = gbuffers if isinstance(gbuffers, GBuffers) else GBuffers(torch.as_tensor(gbuffers))
        return Shade(LightSchedule.from_prompts(wording, head, reader), shade.prior).step(g)

    shade.prior = prior or ShadingPrior()
    return shade


def light_head_scores() -> dict:
    """The shipped light head on the held-out paraphrases and side phrasings (training/light_head.py)."""
    from ..model_zoo import light_head
    from ..model_zoo.bundle import load_text_encoder
    from ..model_zoo.text_encoder import MINILM
    from .light_head import examples, score

    report = score(light_head.load(), load_text_encoder(MINILM), examples("heldout"))
    report.pop("misses")
    return report


def _runtime(flash, text, args) -> dict:
    """Student streaming speed at --runtime-size on a fresh world clip (G-buffers only)."""
    from ..streaming.render.pipelines import FlashPipeline
    from ..streaming.values import PromptSchedule
    from ..streaming.world import WorldConfig, WorldSource

    h, w = args.runtime_size
    src = WorldSource(WorldConfig(seed=200000, width=w, height=h, num_frames=args.runtime_frames, presets=()))
    gb = next(iter(src.teacher_chunks(args.runtime_frames)))
    sched = PromptSchedule.encode(text, "colourful toys in a courtyard at sunset")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out, secs, first = _render(FlashPipeline(flash, sched, seed=args.seed, refine=not args.no_refiner), gb)
    return {"size": [h, w], "frames": int(out.shape[0]), "fps": out.shape[0] / secs, "first_frame_s": first,
            "seconds": secs, "peak_rss_mb": max(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024,
            "goal_fps": 30}


# The long stream: a scene seed no stage trains or evaluates on (training 0-127, held-out 100000-,
# runtime 200000), the world settings of training/configs/data.json, and the first held-out
# wording of the sunset preset (issue #32's measurement was a sunset stream).
LONG_SEED = 300_000
LONG_PRESET = "sunset_dramatic"
LONG_FPS, LONG_OBJECTS = 16.0, 12
# world v2's long stream: a street walked back and forth at eye height (a cut where the walk turns),
# path traced at the data stage's samples per pixel
LONG_WORLDS = ("physics", "v2")
LONG_V2_SCENE, LONG_V2_CAMERA, LONG_V2_SPP = "street", "walk", 32


def check_long_stream(frames: int, block: int, size: tuple[int, int]) -> None:
    """One line naming the option for a long stream the axis cannot score."""
    from ..model_zoo.errors import AlayaError

    if block < 1 or frames < 2 * block:
        raise AlayaError(f"--long-frames {frames}: give at least two blocks of --long-block {block} frames")
    if frames % block:
        raise AlayaError(f"--long-frames {frames}: give a multiple of --long-block {block}")
    if size[0] % 16 or size[1] % 16:
        raise AlayaError(f"--long-size {size[1]}x{size[0]}: each side must be a multiple of 16")


def long_stream(flash, text, frames: int, block: int, size: tuple[int, int], seed: int = 0, refine: bool = True,
                quiet: bool = True, world_kind: str = "physics", world_light: bool = False) -> dict:
    """PSNR per `block` frames of one `frames`-frame world stream rendered as one continuous stream
    (first block, last block, drop = first - last: the content's change and the stream's decay
    together), and of fresh streams started at the midpoint block and at the last block (each
    against the long stream's PSNR over the same frames: the cost of the stream's state, with the
    content held equal; at the last block that cost is the drift, `drift_db`). The world (`world_kind`: the physics world, or world v2's street,
    path traced) is rendered as the stream goes: memory stays bounded. world_light: the physics world
    lights a light-reading model by its own sun, frame by frame, as an engine would (else the prompt's
    light: the light head cannot know where the orbiting camera sees the sun from)."""
    from collections import deque

    import numpy as np
    import torch
    from tqdm import tqdm

    from .data import CAMERAS
    from .prompts import prompts as wordings
    from ..streaming import metrics
    from ..streaming.render.pipelines import FlashPipeline, encoder_reads_light
    from ..streaming.values import GBuffers, PromptSchedule
    from ..streaming.gbuffer import frame_to_teacher
    from ..streaming.world import WorldConfig, WorldSource

    check_long_stream(frames, block, size)
    h, w = size
    if world_kind == "v2":
        from ..streaming.world.traced import TracedConfig, TracedSource

        world = TracedConfig(seed=LONG_SEED, scene=LONG_V2_SCENE, camera=LONG_V2_CAMERA, width=w, height=h, fps=LONG_FPS,
                             num_frames=frames, presets=(LONG_PRESET,), spp=LONG_V2_SPP)
        source = TracedSource(world)
    else:
        world = WorldConfig(seed=LONG_SEED, width=w, height=h, fps=LONG_FPS, num_frames=frames, num_objects=LONG_OBJECTS,
                            camera=CAMERAS[LONG_SEED % len(CAMERAS)], presets=(LONG_PRESET,))
        source = WorldSource(world)
    wording = wordings(LONG_PRESET, "heldout")[0]
    sched = PromptSchedule.encode(text, wording)
    starts = sorted({frames // block // 2 * block, frames - block})  # fresh streams' first frames, on block boundaries
    truth = deque()  # ground truth (H, W, 3) uint8 of frames fed to the pipeline and not yet scored
    fresh = {start: [] for start in starts}  # (G-buffers, ground truth, light) of the block from each start

    def chunks(items):
        """G-buffers (5, H, W, 3) uint8 in GBuffers chunks: frame 0 alone, then 4 at a time (whole latents)."""
        part = []
        for k, gb in enumerate(items):
            part.append(gb)
            if k == 0 or len(part) == 4:
                yield GBuffers(torch.from_numpy(np.stack(part)))
                part = []
        if part:
            yield GBuffers(torch.from_numpy(np.stack(part)))

    reads = encoder_reads_light(flash.gbuffer_encoder) or (refine and getattr(flash.refiner, "reads_light", False))
    lit = world_light and world_kind == "physics" and reads

    def world_gbuffers(pipe):
        from ..streaming.world.shading import heading, light_of

        for frame, camera in source.frames_with_cameras() if lit else ((f, None) for f in source):
            gb, rgb = frame_to_teacher(frame), frame.extras["rgb"]
            light = light_of(LONG_PRESET, heading(camera)) if lit else None
            if lit:
                pipe.set_light(light, frame.index)
            truth.append(rgb)
            start = frame.index // block * block
            if start in fresh:
                fresh[start].append((gb, rgb, light))
            yield gb

    def blocks(pipe, items, gts):
        """PSNR of each block of the pipeline's frames against gts.popleft()'s, as they come."""
        out, ref = [], []
        for chunk in pipe.run(chunks(items)):
            for frame in chunk:
                out.append(frame)
                ref.append(torch.from_numpy(gts.popleft()).float() / 255)
                if len(out) == block:
                    yield metrics.psnr(torch.stack(out), torch.stack(ref))
                    out, ref = [], []

    bar = tqdm(total=frames // block + len(starts), desc="long stream", unit="block", file=sys.stderr,
               disable=quiet or not sys.stderr.isatty())
    curve = []
    t0 = time.perf_counter()
    pipe = FlashPipeline(flash, sched, seed=seed, refine=refine)
    for value in blocks(pipe, world_gbuffers(pipe), truth):
        curve.append(value)
        bar.update()
    secs = time.perf_counter() - t0

    def fresh_start(start: int) -> dict:
        """A new stream over the block from `start` alone (its frames' own lights), against the long stream's."""
        items = fresh[start]
        lights = None
        if lit:
            from ..model_zoo.light import pack
            from ..streaming.render.lighting import recorded

            lights = recorded(pack([light for *_, light in items]))
        psnr = next(blocks(FlashPipeline(flash, sched, seed=seed, refine=refine, lights=lights), [g for g, *_ in items],
                           deque(r for _, r, _ in items)))
        bar.update()
        stream = curve[start // block]
        return {"frame": start, "psnr_db": psnr, "stream_psnr_db": stream, "gain_db": psnr - stream}

    restarts = [fresh_start(start) for start in starts]
    bar.close()
    return {"frames": frames, "size": [h, w], "block_frames": block, "world": world_kind,
            **({"scene": LONG_V2_SCENE, "spp": LONG_V2_SPP} if world_kind == "v2" else {}),
            "scene_seed": LONG_SEED, "camera": world.camera,
            "preset": LONG_PRESET, "prompt": wording, "light": "the world's" if lit else "the prompt's",
            "fps": frames / secs, "seconds": secs,
            "first_block_psnr_db": curve[0], "last_block_psnr_db": curve[-1], "drop_db": curve[0] - curve[-1],
            "psnr_db_by_block": curve, "fresh_starts": restarts, "drift_db": restarts[-1]["gain_db"]}
