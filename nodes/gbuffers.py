"""G-buffer nodes: Load G-Buffers, Load G-Buffer Videos, Physics World (sources), G-Buffers From / To
Images (stages).

The G-buffer stream type is ALAYA_GBUFFERS: streaming.values.GBuffers, teacher-form uint8
(T, 5, H, W, 3) in MODALITIES order (albedo sRGB, inverse depth, metallic, normal, roughness), with
the source's light passes when it has them (GBuffers.shadow, .sky: Load G-Buffers reads them beside the
passes, G-Buffers From Images takes them as optional images).
"""
from __future__ import annotations

import torch

from . import comfy
from .base import Piecewise, SourceNode, StageNode, refuse

CATEGORY = "alaya-flash/gbuffers"
GBUFFERS = "ALAYA_GBUFFERS"
LAYOUT_CHOICES = ["auto", "teacher-mp4", "image-sequence", "npy-windows"]
CONVENTION_CHOICES = ["auto", "alaya", "blender", "unreal", "unity"]  # = streaming.files.conventions.CONVENTION_CHOICES
RESIZE_CHOICES = ["stretch", "crop"]
MAX_FRAMES = 1_000_000


def _chunk_input(default: int = 16):
    return ("INT", {"default": default, "min": 1, "max": 1024,
                    "tooltip": "Frames per chunk when streaming (the runner's tick); does not change the frames rendered."})


class LoadGBuffers(SourceNode):
    DESCRIPTION = ("Read a G-buffer sequence from disk, lazily: teacher {mod}.mp4 folders, image sequences "
                   "(PNG 8/16-bit, EXR incl. multi-layer) or npy windows, with the engine's light passes when the folder "
                   "has them (shadow.mp4, shadow/, shadow_*.exr or an EXR layer; sky.mp4, sky/, ... likewise). Streams "
                   "chunk by chunk in the runner.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (GBUFFERS, "INT")
    RETURN_NAMES = ("gbuffers", "frame_count")
    OUTPUT_TOOLTIPS = ("G-buffer frames (teacher form)", "Frames in the selected range (0 when unknown)")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "path": ("STRING", {"default": "samples/courtyard", "tooltip": "Folder or .npy file; relative paths start at ComfyUI's input folder (the current folder outside ComfyUI). samples/courtyard is the pack's bundled 17-frame clip."}),
            "layout": (LAYOUT_CHOICES, {"default": "auto", "tooltip": "On-disk layout; auto detects it from the files."}),
            "start": ("INT", {"default": 0, "min": 0, "max": MAX_FRAMES, "tooltip": "First frame to read."}),
            "frames": ("INT", {"default": 0, "min": 0, "max": MAX_FRAMES, "tooltip": "Frames to read after start (before stride); 0 reads to the end."}),
            "stride": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "Read every n-th frame (the fps divides by n)."}),
            "resize": (RESIZE_CHOICES, {"default": "stretch", "tooltip": "stretch: scale to the size (teacher's LANCZOS); crop: keep aspect, centre crop."}),
            "width": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 8, "tooltip": "Output width in pixels, a multiple of 8; 0 keeps the source's."}),
            "height": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 8, "tooltip": "Output height in pixels, a multiple of 8; 0 keeps the source's."}),
            "chunk": _chunk_input(),
        }, "optional": {
            "conventions": (CONVENTION_CHOICES, {"default": "auto", "tooltip": "Which engine wrote float EXR passes (Blender, Unreal MRQ, Unity HDRP AOVs, or alaya = ours): normal space, depth units, pass names. auto detects it from the names. World-space normals need camera.json beside the passes (docs/gbuffers.md)."}),
            "depth_range": ("STRING", {"default": "0.5", "tooltip": "NEAR, NEAR:FAR, auto or auto:FAR in scene units: NEAR is the depth shown brightest in the 8-bit depth; auto takes it from the data (EXR); anything beyond FAR becomes background."}),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, path):
        # ComfyUI reports a returned message once for every input named here, so this names only
        # `path`; the size and depth range are checked when the node runs (first, being a source).
        p = comfy.input_path(path)
        if not p.exists():
            return f"G-buffer path {path!r} not found (looked at {p})"
        return True

    @classmethod
    def IS_CHANGED(cls, path, **_):
        p = comfy.input_path(path)
        return p.stat().st_mtime if p.exists() else float("nan")

    @staticmethod
    def check_values(width=0, height=0) -> list[str | None]:
        """The size widgets (checked when the node runs, first of the graph being a source, and by the
        runner's validation; ComfyUI checks the range, not the step, at queue time)."""
        if (width == 0) != (height == 0):
            return [f"width and height must both be 0 (source size) or both set, got {width}x{height}"]
        odd = [f"{n} {v}" for n, v in (("width", width), ("height", height)) if v % 8]
        return [f"{' and '.join(odd)} must be a multiple of 8 (the models work on 8x8 blocks), e.g. "
                f"{max(8, -(-width // 8) * 8)}x{max(8, -(-height // 8) * 8)}"] if odd else []

    def _stream(self, path, layout, start, frames, stride, resize, width, height, conventions="auto",
                depth_range="0.5"):
        from ..model_zoo.errors import AlayaError
        from ..streaming.files.conventions import parse_depth_range
        from ..streaming.files.readers import open_gbuffers

        refuse("Load G-Buffers", self.check_values(width, height))
        size = (height, width) if width and height else None
        try:
            near, far = parse_depth_range(depth_range)
        except AlayaError as err:
            raise AlayaError(f"Load G-Buffers: {err}") from None
        return open_gbuffers(comfy.input_path(path), None if layout == "auto" else layout, start=start,
                             stop=start + frames if frames else None, stride=stride, size=size, resize=resize,
                             conventions=conventions, depth_near=near, depth_far=far)

    def open_stream(self, path, layout, start, frames, stride, resize, width, height, chunk, conventions="auto",
                    depth_range="0.5"):
        from ..streaming.values import gbuffer_chunks

        stream = self._stream(path, layout, start, frames, stride, resize, width, height, conventions, depth_range)
        count = stream.info.num_frames or 0
        for i, g in enumerate(gbuffer_chunks(stream, chunk)):
            yield g, (count if i == 0 else None)


class LoadGBufferVideos(SourceNode):
    DESCRIPTION = ("Read one G-buffer clip as artists export it: five videos in one folder, albedo.mp4, depth.mp4, "
                   "metallic.mp4, normal.mp4 and roughness.mp4 (AlayaRenderer's clip layout), or CLIP_albedo.mp4 ... "
                   "for several clips side by side. The list holds the clips in ComfyUI's input folder and the pack's "
                   "bundled sample; the passes in the teacher's 8-bit encoding (docs/gbuffers.md).")
    CATEGORY = CATEGORY
    RETURN_TYPES = (GBUFFERS, "INT")
    RETURN_NAMES = ("gbuffers", "frame_count")
    OUTPUT_TOOLTIPS = ("G-buffer frames (teacher form)", "Frames in the selected range")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "clip": (video_clips(), {"default": BUNDLED_CLIP, "tooltip": "A folder of the five pass videos, or FOLDER/CLIP for the CLIP_{pass}.mp4 videos of a folder holding several clips; relative to ComfyUI's input folder. Press R on the canvas to list new clips."}),
            "start": ("INT", {"default": 0, "min": 0, "max": MAX_FRAMES, "tooltip": "First frame to read."}),
            "frames": ("INT", {"default": 0, "min": 0, "max": MAX_FRAMES, "tooltip": "Frames to read after start; 0 reads to the end."}),
            "width": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 8, "tooltip": "Output width in pixels, a multiple of 8; 0 keeps the videos'."}),
            "height": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 8, "tooltip": "Output height in pixels, a multiple of 8; 0 keeps the videos'."}),
            "chunk": _chunk_input(),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, clip):
        # takes `clip` (so ComfyUI leaves its list check to this: a path typed in an API prompt works too)
        from ..streaming.files.readers import clip_files

        p = comfy.input_path(clip)
        if p.is_dir() or (p.parent.is_dir() and clip_files(p.parent, p.name)):  # a folder's videos are checked when read
            return True
        return (f"G-buffer videos {clip!r} not found (looked for {p}/albedo.mp4 ... and {p}_albedo.mp4 ...: "
                "the five passes albedo, depth, metallic, normal, roughness)")

    @classmethod
    def IS_CHANGED(cls, clip, **_):
        p = comfy.input_path(clip)
        files = sorted(p.glob("*.mp4")) if p.is_dir() else sorted(p.parent.glob(f"{p.name}_*.mp4"))
        return tuple(f.stat().st_mtime for f in files)

    def open_stream(self, clip, start, frames, width, height, chunk):
        yield from LoadGBuffers().open_stream(clip, "teacher-mp4", start, frames, 1, "stretch", width, height, chunk)


BUNDLED_CLIP = "samples/courtyard"


def video_clips() -> list[str]:
    """The G-buffer video clips Load G-Buffer Videos lists: those in ComfyUI's input folder (inside
    ComfyUI), then the pack's bundled sample."""
    from ..streaming.files.readers import find_video_clips

    found = find_video_clips(comfy.input_path(".")) if comfy.in_comfyui() else []
    return list(dict.fromkeys(found + [BUNDLED_CLIP]))


class PhysicsWorld(SourceNode):
    DESCRIPTION = ("A procedural physics scene (MuJoCo rigid bodies, headless rasterizer) as a G-buffer source: "
                   "the same seed gives the same frames.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (GBUFFERS,)
    RETURN_NAMES = ("gbuffers",)

    @classmethod
    def INPUT_TYPES(cls):
        from ..streaming.world.camera import CAMERA_PATHS

        return {"required": {
            "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1, "tooltip": "Scene seed: objects, materials, initial motion."}),
            "width": ("INT", {"default": 256, "min": 8, "max": 2048, "step": 8, "tooltip": "Frame width in pixels (multiple of 8 for the models)."}),
            "height": ("INT", {"default": 256, "min": 8, "max": 2048, "step": 8, "tooltip": "Frame height in pixels (multiple of 8 for the models)."}),
            "frames": ("INT", {"default": 64, "min": 1, "max": MAX_FRAMES, "tooltip": "Frames to simulate."}),
            "objects": ("INT", {"default": 16, "min": 0, "max": 200, "tooltip": "Number of rigid bodies in the scene."}),
            "camera": (list(CAMERA_PATHS), {"default": "orbit", "tooltip": "Camera path through the scene."}),
            "fps": ("FLOAT", {"default": 16.0, "min": 1.0, "max": 240.0, "tooltip": "Frames per second of simulated time."}),
            "chunk": _chunk_input(),
        }}

    def open_stream(self, seed, width, height, frames, objects, camera, fps, chunk):
        from ..streaming.values import gbuffer_chunks
        from ..streaming.world import WorldConfig, world_stream

        cfg = WorldConfig(seed=seed, width=width, height=height, num_frames=frames, num_objects=objects,
                          camera=camera, fps=fps, presets=())
        for g in gbuffer_chunks(world_stream(cfg), chunk):
            yield (g,)


class GBuffersFromImages(StageNode):
    DESCRIPTION = ("Build G-buffers from five IMAGE inputs (any image or EXR loader can feed it). "
                   "encoding 'teacher': images already in the teacher's 8-bit encoding; 'float': albedo linear, "
                   "depth in scene units (channel 0), normals in [-1, 1] camera space (OpenGL), metallic/roughness in [0, 1]. "
                   "An engine's shadow images (white where the sun reaches) and sky images (white where a surface "
                   "sees the whole sky) may go in too: the shading prior then takes its shadows and its ambient "
                   "occlusion from them.")
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("albedo", "depth", "metallic", "normal", "roughness", "shadow", "sky")  # MODALITIES + LIGHT_PASSES
    RETURN_TYPES = (GBUFFERS,)
    RETURN_NAMES = ("gbuffers",)

    @classmethod
    def INPUT_TYPES(cls):
        img = lambda what: ("IMAGE", {"tooltip": what})  # noqa: E731
        return {"required": {
            "albedo": img("Albedo frames [T, H, W, 3]."),
            "depth": img("Depth frames [T, H, W, C] (channel 0 is read)."),
            "metallic": img("Metallic frames (channel 0 is read)."),
            "normal": img("Normal frames [T, H, W, 3]."),
            "roughness": img("Roughness frames (channel 0 is read)."),
            "encoding": (["teacher", "float"], {"default": "teacher", "tooltip": "How the images encode the passes (see the node description)."}),
            "depth_near": ("FLOAT", {"default": 0.5, "min": 1e-4, "max": 1e4, "step": 0.01, "tooltip": "Scene units shown at full brightness in inverse depth (float encoding only)."}),
            "fps": ("FLOAT", {"default": 16.0, "min": 1.0, "max": 240.0, "tooltip": "Frame rate carried with the G-buffers."}),
        }, "optional": {
            "shadow": img("The engine's shadow pass, the sun's visibility: white where the sun reaches, black in its "
                          "shadow (grey; colour is averaged), the passes' size. The shading prior takes its shadows "
                          "from it instead of marching screen-space ones; unconnected: it marches its own."),
            "sky": img("The engine's sky pass, its sky occlusion: white where a surface sees the whole sky, black "
                       "where it sees none (a room's walls and ceiling block it; grey, colour averaged), the passes' "
                       "size. The shading prior takes its ambient occlusion from it; unconnected: its own."),
        }}

    def start_stream(self, encoding, depth_near, fps):
        return Piecewise(_FromImages(encoding, depth_near, fps), 16)


class _FromImages:
    def __init__(self, encoding, depth_near, fps):
        self.encoding, self.depth_near, self.fps = encoding, depth_near, fps
        self.pending: dict[str, list[torch.Tensor]] = {m: [] for m in GBuffersFromImages.STREAM_INPUTS}
        self.light: tuple[str, ...] = ()  # the light inputs connected (the runner and ComfyUI pass only connected inputs)

    def step(self, **images):
        from ..streaming.gbuffer import LIGHT_PASSES, MODALITIES
        from ..streaming.values import GBuffers, gbuffers_from_images

        self.light = tuple(n for n in LIGHT_PASSES if n in self.light or n in images)
        for name, value in images.items():
            if value is not None:
                self.pending[name].append(value)
        names = MODALITIES + self.light
        ready = min(sum(len(v) for v in self.pending[m]) for m in names)
        if ready == 0:
            return None
        parts = {}
        for m in names:
            joined = torch.cat(self.pending[m])
            parts[m], rest = joined[:ready], joined[ready:]
            self.pending[m] = [rest] if len(rest) else []
        images = gbuffers_from_images(parts, self.encoding, self.depth_near)
        light = {n: light_from_image(n, parts[n], tuple(images.shape[2:4])) for n in self.light}
        return (GBuffers(images, self.fps, self.depth_near, **light),)

    def flush(self):
        from ..streaming.gbuffer import MODALITIES

        left = {m: sum(len(v) for v in vs) for m, vs in self.pending.items() if m in MODALITIES + self.light}
        if any(left.values()):
            from ..model_zoo.errors import AlayaError

            raise AlayaError(f"G-Buffers From Images: the passes have different frame counts (left over: {left})")
        return None


def light_from_image(name: str, image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A light pass IMAGE (T, H, W, C) in [0, 1] (`name`: shadow, sky) -> the pass, uint8 (T, H, W), 255 = seen
    (the sun, the whole sky): colour channels averaged (a grey image's are equal), alpha dropped."""
    from ..model_zoo.errors import AlayaError

    if image.ndim != 4 or tuple(image.shape[1:3]) != size:
        got = f"{image.shape[2]}x{image.shape[1]}" if image.ndim == 4 else f"of shape {tuple(image.shape)}"
        raise AlayaError(f"G-Buffers From Images: {name} is {got}, expected {size[1]}x{size[0]} like the passes")
    x = image.detach().float().cpu()
    grey = x[..., :3].mean(-1) if x.shape[-1] >= 3 else x[..., 0]
    return grey.clamp(0, 1).mul(255).round().to(torch.uint8)


class GBuffersToImages(StageNode):
    DESCRIPTION = "Show the five passes as IMAGE batches (teacher encoding, [0, 1]) to inspect them on the canvas."
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("gbuffers",)
    RETURN_TYPES = ("IMAGE",) * 5
    RETURN_NAMES = ("albedo", "depth", "metallic", "normal", "roughness")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"gbuffers": (GBUFFERS, {"tooltip": "G-buffer frames to show."})}}

    def start_stream(self):
        return _ToImages()


class _ToImages:
    def step(self, gbuffers):
        if gbuffers is None:
            return None
        x = gbuffers.images.float().div(255)  # (T, 5, H, W, 3)
        return tuple(comfy.intermediate(x[:, i].contiguous()) for i in range(5))

    def flush(self):
        return None


NODES = {
    "AlayaFlash_LoadGBuffers": (LoadGBuffers, "Load G-Buffers (Alaya Flash)"),
    "AlayaFlash_LoadGBufferVideos": (LoadGBufferVideos, "Load G-Buffer Videos (Alaya Flash)"),
    "AlayaFlash_PhysicsWorld": (PhysicsWorld, "Physics World (Alaya Flash)"),
    "AlayaFlash_GBuffersFromImages": (GBuffersFromImages, "G-Buffers From Images (Alaya Flash)"),
    "AlayaFlash_GBuffersToImages": (GBuffersToImages, "G-Buffers To Images (Alaya Flash)"),
}
