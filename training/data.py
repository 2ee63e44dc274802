"""Training data from the physics world: the same geometry under every lighting preset.

`alaya-flash train data --config data.json` renders clips with streaming/world (MuJoCo scenes,
exact G-buffers, PBR ground truth) and stores each clip as one compressed .npz:

    gbuffers  uint8 (T, 5, H, W, 3)   teacher form, MODALITIES order (streaming/gbuffer.py)
    rgb       uint8 (P, T, H, W, 3)   ground truth under each of the P presets, sRGB
    presets   str (P,)                preset names, PRESETS order (streaming/world/shading.py)
    rgb_turned uint8 (P, T, H, W, 3)  only with sun_turns > 1: the ground truth averaged over the
                                      world turned by 360 / sun_turns degrees steps (below)
    light     float32 (P, T, 30)      each preset's light per frame as the shading prior reads it
                                      (model_zoo/light.py, packed; the sun relative to the camera's heading)
    up        float32 (T, 3)          the camera's up vector in camera space per frame
                                      (clips made before 2026-12-07 have neither)

The courtyard is square and the G-buffers' normals are in camera space, so a new scene's input
does not say which of its walls face the sun: the world turned by 90 degrees gives the same
G-buffers under another light. The mean over those turns (sun_turns 4) is what a model that
cannot see the sun's side should aim for, the expectation of the ground truth given the input;
the refiner stage can train towards it (its `target`).

World v2 (`world` "pathtrace"): clips come from streaming/world/traced instead: streets,
courtyards and interiors (`scenes`, cycled with the seed; camera walk / drive / orbit cycled too),
exact G-buffers, ground truth path traced by Mitsuba 3 at `spp` samples under every world v2
preset, the sun on a seeded side of the first frame's heading. Each .npz adds

    captions  str (P,)                the clip's caption per preset: its scene and the sun's side
    sun_visibility uint8 (P, T, H, W) 255 = sunlit, 0 = shadowed or facing away (shadow metrics)
    sky_visibility uint8 (T, H, W)    the sky pass: 255 = the surface sees the whole sky, 0 none
                                      (clips made before 2026-12-08 have none)
    ground    bool (T, H, W)          road, pavement or floor pixels
    renderer  str ()                  the Mitsuba variant that traced it ("mitsuba llvm_ad_rgb")
    passes    int ()                  independent renders of spp samples each truth averages
    truth_noise_mse float32 (P, T)    with passes > 1 (held-out clips, heldout_passes): each truth's
                                      own noise, 8-bit levels squared, from the spread of its passes

and dataset.json adds "world": "pathtrace" and per-clip "clip_info" (scene, camera, sun side,
renderer, captions); every v1 key keeps its meaning, so the training stages read it unchanged.

Splits are by scene seed: training clips use seeds train_seed .. train_seed + train_clips - 1,
held-out clips heldout_seed .. (disjoint), so no held-out geometry is ever trained on. Prompts
have their own split (prompts.py). dataset.json lists clips, presets and prompt wordings.
Camera paths cycle over orbit / fly / follow with the seed, for varied motion.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..model_zoo.errors import AlayaError
from .prompts import prompts

DATASET_FORMAT = "alaya-flash world dataset v1"
CAMERAS = ("orbit", "fly", "follow")


@dataclass(frozen=True)
class DataConfig:
    out: str = "runs/data"
    width: int = 128
    height: int = 128
    frames: int = 25  # per clip; windows of 4k+1 frames are cut from it in training
    fps: float = 8.0
    train_clips: int = 24
    heldout_clips: int = 4
    train_seed: int = 0
    heldout_seed: int = 100000
    objects: int = 12
    shadows: bool = False  # shadows need sun visibility, which the G-buffers do not carry
    backend: str = "auto"
    presets: tuple = ()  # () = every preset
    sun_turns: int = 1  # > 1: also store the ground truth averaged over this many turns of the world
    world: str = "physics"  # "physics" (MuJoCo, deferred shading) or "pathtrace" (world v2, Mitsuba 3)
    scenes: tuple = ("street", "courtyard", "interior")  # world v2 scene kinds, cycled with the seed
    spp: int = 32  # world v2: path-traced samples per pixel
    max_depth: int = 4  # world v2: path length (3: one indirect bounce)
    # world v2: "auto" puts the sun on each clip's seeded side; "opposite" on the other side of the same
    # clip (a side-paired copy of a dataset of the same seeds: the same G-buffers, the shadows moved)
    sun: str = "auto"
    variant: str = "auto"  # world v2: Mitsuba variant (scalar_rgb, llvm_ad_rgb; auto: llvm where libLLVM >= 16 is installed)
    # world v2: held-out truths average this many independent renders of spp samples each and store their
    # own noise (truth_noise_mse), which eval reports; training clips render once (their noise averages out)
    heldout_passes: int = 1

    def validate(self) -> "DataConfig":
        if self.world not in WORLDS:
            raise AlayaError(f"data config: world {self.world!r} is unknown; choose one of {', '.join(WORLDS)}")
        if self.sun_turns < 1:
            raise AlayaError(f"data config: sun_turns {self.sun_turns} must be >= 1")
        if self.world == "pathtrace":
            from ..streaming.world.traced import KINDS

            if self.sun_turns > 1:
                raise AlayaError("data config: sun_turns applies to the physics world; world v2 names the sun's side "
                                 "in its captions")
            if not self.scenes or any(k not in KINDS for k in self.scenes):
                raise AlayaError(f"data config: scenes {list(self.scenes)} must be some of {', '.join(KINDS)}")
            from ..streaming.world.traced.render import check_variant

            check_variant(self.variant)
            if self.sun not in ("auto", "opposite"):
                raise AlayaError(f"data config: sun {self.sun!r} is not 'auto' (each clip's seeded side) or 'opposite'")
        elif self.sun != "auto":
            raise AlayaError("data config: sun applies to world v2 (\"world\": \"pathtrace\")")
        elif self.heldout_passes != 1:
            raise AlayaError("data config: heldout_passes applies to world v2 (\"world\": \"pathtrace\")")
        from ..streaming.world.traced.source import MAX_PASSES

        if not 1 <= self.heldout_passes <= MAX_PASSES:
            raise AlayaError(f"data config: heldout_passes {self.heldout_passes} is out of range 1..{MAX_PASSES}")
        names = _preset_table(self.world)
        for name in self.presets:
            if name not in names:
                raise AlayaError(f"data config: preset {name!r} is unknown; choose from {', '.join(names)}")
        if self.frames < 5 or self.train_clips < 1 or self.heldout_clips < 0:
            raise AlayaError("data config: need frames >= 5, train_clips >= 1 and heldout_clips >= 0")
        if self.heldout_seed < self.train_seed + self.train_clips and self.heldout_seed + self.heldout_clips > self.train_seed:
            raise AlayaError("data config: held-out seeds overlap the training seeds")
        return self

    @property
    def preset_names(self) -> tuple[str, ...]:
        return tuple(self.presets) or tuple(_preset_table(self.world))


WORLDS = ("physics", "pathtrace")


def _preset_table(world: str) -> dict:
    if world == "pathtrace":
        from ..streaming.world.traced import TRACED_PRESETS

        return TRACED_PRESETS
    from ..streaming.world.shading import PRESETS

    return PRESETS


def traced_config(cfg: DataConfig, seed: int, passes: int = 1):
    """The world v2 clip of `seed`: scene kind and camera path cycle with it; `passes` renders per truth."""
    from ..streaming.world.traced import TracedConfig, make_scene
    from ..streaming.world.traced.paths import available_paths
    from ..streaming.world.traced.presets import OPPOSITE_SIDE

    kind = cfg.scenes[seed % len(cfg.scenes)]
    paths = available_paths(make_scene(kind, seed))
    config = TracedConfig(seed=seed, scene=kind, width=cfg.width, height=cfg.height, fps=cfg.fps,
                          num_frames=cfg.frames, camera=paths[(seed // len(cfg.scenes)) % len(paths)],
                          presets=cfg.preset_names, spp=cfg.spp, max_depth=cfg.max_depth, variant=cfg.variant,
                          passes=passes)
    return replace(config, sun=OPPOSITE_SIDE[config.sun_side()]) if cfg.sun == "opposite" else config


def render_traced_clip(cfg: DataConfig, seed: int, passes: int = 1) -> tuple[dict[str, np.ndarray], dict]:
    """One world v2 clip (arrays as render_clip's plus captions, sun_visibility, ground, passes and, with
    passes > 1, truth_noise_mse (P, T) float32: each truth's own noise in 8-bit levels squared) and its clip_info."""
    from ..streaming.gbuffer import frame_to_teacher
    from ..streaming.world.traced import TracedWorld

    config = traced_config(cfg, seed, passes)
    world = TracedWorld(config)
    names = config.presets
    ground_ids = np.array(world.desc.ground_objects)
    gbuffers, rgb, vis, ground, noise, lights, sky = [], [], [], [], [], [], []
    suffix = (lambda n: f"_{n}") if len(names) > 1 else (lambda n: "")
    for frame, camera in world.frames(range(config.num_frames)):
        gbuffers.append(frame_to_teacher(frame))
        lights.append(frame_lights(world.lighting, camera, world.desc.exposure))
        rgb.append([frame.extras["rgb" + suffix(n)] for n in names])
        if passes > 1:
            noise.append([frame.extras["truth_noise_mse" + suffix(n)] for n in names])
        vis.append([np.rint(frame.extras["sun_visibility" + suffix(n)] * 255).astype(np.uint8) for n in names])
        ground.append(np.isin(frame.extras["object_id"], ground_ids))
        if "sky_visibility" in frame.extras:
            sky.append(np.rint(frame.extras["sky_visibility"] * 255).astype(np.uint8))
    clip = {"gbuffers": np.stack(gbuffers), "rgb": np.stack(rgb).transpose(1, 0, 2, 3, 4).copy(),
            "presets": np.array(names), "captions": np.array([world.captions[n] for n in names]),
            "sun_visibility": np.stack(vis).transpose(1, 0, 2, 3).copy(), "ground": np.stack(ground),
            "passes": np.array(passes), **_stack_lights(lights)}
    if sky:
        clip["sky_visibility"] = np.stack(sky)
    if noise:
        clip["truth_noise_mse"] = np.array(noise, dtype=np.float32).T.copy()
    renderer = world.metadata()["renderer"]
    clip["renderer"] = np.array(renderer)
    info = {"scene": config.scene, "camera": config.camera, "sun_side": world.side, "renderer": renderer,
            "passes": passes, "captions": dict(world.captions)}
    return clip, info


def frame_lights(lightings, camera, exposure: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Each preset's light as the shading prior reads it for this camera (packed, camera-relative: the sun's
    azimuth from the camera's heading; `exposure`: the scene's, times the preset's, as world v2's truth is
    tone-mapped) and the camera's up vector: what each frame was lit by."""
    from ..model_zoo.light import pack
    from ..streaming.world.shading import heading, light_of

    facing = heading(camera)
    lights = [light_of(p, facing) for p in lightings]
    lights = [lt.replace(exposure=lt.exposure * exposure) for lt in lights] if exposure != 1.0 else lights
    return pack(lights).numpy(), (camera.rotation @ np.array([0.0, 0.0, 1.0])).astype(np.float32)


def _stack_lights(lights: list) -> dict[str, np.ndarray]:
    """'light' (P, T, PACKED) float32 and 'up' (T, 3) float32 from frame_lights per frame."""
    return {"light": np.stack([lt for lt, _ in lights], 1), "up": np.stack([up for _, up in lights])}


def render_clip(cfg: DataConfig, seed: int) -> dict[str, np.ndarray]:
    """One clip: G-buffers (teacher form) and ground truth under every preset (and, with sun_turns > 1,
    its mean over the world's turns). World v2 clips: render_traced_clip."""
    if cfg.world == "pathtrace":
        return render_traced_clip(cfg, seed)[0]
    from ..streaming.gbuffer import frame_to_teacher
    from ..streaming.world import WorldConfig, WorldSource
    from ..streaming.world.shading import get_preset, shade, turned

    names = cfg.preset_names
    world = WorldConfig(seed=seed, width=cfg.width, height=cfg.height, fps=cfg.fps, num_frames=cfg.frames,
                        num_objects=cfg.objects, camera=CAMERAS[seed % len(CAMERAS)], presets=names,
                        shadows=cfg.shadows, backend=cfg.backend)
    turns = [[turned(get_preset(n), 360 * k / cfg.sun_turns) for k in range(cfg.sun_turns)] for n in names]
    gbuffers, rgb, mean, lights = [], [], [], []
    for frame, camera in WorldSource(world).frames_with_cameras():
        gbuffers.append(frame_to_teacher(frame))
        lights.append(frame_lights([get_preset(n) for n in names], camera))
        rgb.append([frame.extras[f"rgb_{n}"] if len(names) > 1 else frame.extras["rgb"] for n in names])
        if cfg.sun_turns > 1:  # an average of sRGB values: the metrics' space
            passes = frame.passes()
            mean.append([np.rint(np.mean([shade(passes, camera, p).astype(np.float32) for p in ps], 0)).astype(np.uint8)
                         for ps in turns])
    clip = {"gbuffers": np.stack(gbuffers), "rgb": np.stack(rgb).transpose(1, 0, 2, 3, 4).copy(),
            "presets": np.array(names), **_stack_lights(lights)}
    if mean:
        clip["rgb_turned"] = np.stack(mean).transpose(1, 0, 2, 3, 4).copy()
    return clip


def _save_npz(path: Path, arrays: dict) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def build_dataset(cfg: DataConfig, progress=None, log=None) -> Path:
    """Render every clip not already on disk (so an interrupted build resumes); write dataset.json."""
    out = Path(cfg.out)
    splits = {"train": range(cfg.train_seed, cfg.train_seed + cfg.train_clips),
              "heldout": range(cfg.heldout_seed, cfg.heldout_seed + cfg.heldout_clips)}
    meta_path = out / "dataset.json"
    if meta_path.is_file():
        # keys added since a dataset was made read as their defaults (which reproduce the old data)
        old = {**_jsonable(DataConfig()), **json.loads(meta_path.read_text()).get("config", {})}
        free = ("train_clips", "heldout_clips", "heldout_passes")  # held-out clips of other passes are rendered again
        if {k: v for k, v in old.items() if k not in free} != {k: v for k, v in _jsonable(cfg).items() if k not in free}:
            raise AlayaError(f"{meta_path}: this folder holds a dataset made with another config; use a new 'out'")
    clips, clip_info = {}, {}
    for split, seeds in splits.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        clips[split] = []
        passes = cfg.heldout_passes if split == "heldout" else 1
        for seed in seeds:
            path = out / split / f"clip-{seed:06d}.npz"
            name = str(path.relative_to(out))
            have = _passes(path) if path.is_file() and cfg.world == "pathtrace" else None
            stale = have is not None and have != passes
            if not path.is_file() or stale:
                if cfg.world == "pathtrace":
                    arrays, clip_info[name] = render_traced_clip(cfg, seed, passes)
                else:
                    arrays = render_clip(cfg, seed)
                _save_npz(path, arrays)
                if log:
                    log.info("rendered %s%s", path, f" again ({passes} passes a truth)" if stale else "")
            elif cfg.world == "pathtrace":  # resumed: the clip's info from its arrays
                with np.load(path) as z:
                    tc = traced_config(cfg, seed)
                    clip_info[name] = {"scene": tc.scene, "camera": tc.camera, "sun_side": tc.sun_side(),
                                       # clips from before llvm_ad_rgb worked here were all scalar_rgb renders
                                       "renderer": str(z["renderer"]) if "renderer" in z else "mitsuba scalar_rgb",
                                       "passes": have,
                                       "captions": dict(zip(z["presets"].tolist(), z["captions"].tolist()))}
            clips[split].append(name)
            if progress:
                progress(1)
    names = cfg.preset_names
    meta = {"format": DATASET_FORMAT, "config": _jsonable(cfg), "presets": list(names), "clips": clips,
            "prompts": {n: {"train": prompts(n, "train"), "heldout": prompts(n, "heldout")} for n in names}}
    if cfg.world == "pathtrace":
        meta["world"] = "pathtrace"
        meta["clip_info"] = clip_info
    tmp = meta_path.with_name("dataset.json.tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, meta_path)
    return out


def _passes(path: Path) -> int:
    """The renders a world v2 clip's truths average (clips from before passes were recorded: 1)."""
    with np.load(path) as z:
        return int(z["passes"]) if "passes" in z else 1


def _jsonable(cfg: DataConfig) -> dict:
    from dataclasses import asdict

    d = asdict(cfg)
    d["presets"] = list(d["presets"])
    d["scenes"] = list(d["scenes"])
    return d


def dataset_meta(root: str | Path, split: str) -> dict:
    """A dataset folder's dataset.json (presets, prompt wordings, clip files per split), checked, without
    loading any clip."""
    meta_path = Path(root) / "dataset.json"
    if not meta_path.is_file():
        raise AlayaError(f"{root}: no dataset.json here; run `alaya-flash train data` first")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != DATASET_FORMAT:
        raise AlayaError(f"{meta_path}: format is {meta.get('format')!r}, expected {DATASET_FORMAT!r}")
    if split not in meta["clips"]:
        raise AlayaError(f"{meta_path}: no split {split!r}; splits: {', '.join(meta['clips'])}")
    return meta


class ClipSet:
    """A split of a dataset in memory: gbuffers (N, T, 5, H, W, 3) and rgb (N, P, T, H, W, 3), uint8."""

    def __init__(self, root: str | Path, split: str):
        root = Path(root)
        meta = dataset_meta(root, split)
        meta_path = root / "dataset.json"
        self.root, self.split, self.meta = root, split, meta
        self.presets: list[str] = meta["presets"]
        self.prompts: dict[str, dict[str, list[str]]] = meta["prompts"]
        files = meta["clips"][split]
        if not files:
            raise AlayaError(f"{meta_path}: split {split!r} has no clips")
        g, r, turned, captions, lights, ups, shadows, skies = [], [], [], [], [], [], [], []
        for name in files:
            with np.load(root / name) as z:
                g.append(z["gbuffers"])
                r.append(z["rgb"])
                if "light" in z:
                    lights.append(z["light"])
                    ups.append(z["up"])
                if "rgb_turned" in z:
                    turned.append(z["rgb_turned"])
                if "captions" in z:
                    captions.append(z["captions"].tolist())
                if "sun_visibility" in z:
                    shadows.append(z["sun_visibility"])
                if "sky_visibility" in z:
                    skies.append(z["sky_visibility"])
        self.gbuffers = np.stack(g)
        self.rgb = np.stack(r)
        # World v2: each clip's caption per preset (its scene and the sun's side), else None.
        self.captions: list[list[str]] | None = captions if len(captions) == len(files) else None
        # The ground truth's mean over the world's turns (a dataset made with sun_turns > 1), else None.
        self.rgb_turned = np.stack(turned) if len(turned) == len(files) else None
        # Each preset's light per frame (N, P, T, PACKED) and the camera's up (N, T, 3), else None (older data).
        self.light = np.stack(lights) if len(lights) == len(files) else None
        self.up = np.stack(ups) if len(ups) == len(files) else None
        # World v2: each preset's sun visibility per pixel (N, P, T, H, W) uint8, 255 lit (the path tracer's
        # shadows: what an engine's shadow pass gives), else None.
        self.sun_visibility = np.stack(shadows) if len(shadows) == len(files) else None
        # World v2: the sky pass (N, T, H, W) uint8, 255 = the whole sky seen (what an engine's sky occlusion
        # gives), else None.
        self.sky_visibility = np.stack(skies) if len(skies) == len(files) else None

    def __len__(self) -> int:
        return len(self.gbuffers)

    @property
    def frames(self) -> int:
        return self.gbuffers.shape[1]

    def windows(self, length: int) -> list[tuple[int, int]]:
        """(clip, first frame) of every non-overlapping window of `length` frames."""
        return [(c, s) for c in range(len(self)) for s in range(0, self.frames - length + 1, length - 1 or 1)]


def run_data(cfg: DataConfig, log, progress=None) -> int:
    """The `data` stage: render the dataset (resumable clip by clip)."""
    if progress:
        progress(0, {})
    build_dataset(cfg, progress=(lambda n: progress(n, {})) if progress else None, log=log)
    log.info("dataset ready in %s: %d train + %d held-out clips of %d frames at %dx%d", cfg.out, cfg.train_clips,
             cfg.heldout_clips, cfg.frames, cfg.width, cfg.height)
    return cfg.train_clips + cfg.heldout_clips
