"""The values that flow between stages: G-buffer chunks, latents, prompt schedules.

Every stage (streaming/render/pipelines.py), node and sink passes these; both chunk values join
with `concat` along time and cut with `pieces`:

    GBuffers        images uint8 (T, 5, H, W, 3), teacher form, MODALITIES order; fps; depth_near;
                    shadow uint8 (T, H, W) or None: the engine's shadow pass (255 where the sun reaches);
                    sky uint8 (T, H, W) or None: the engine's sky pass (255 where the whole sky is seen)
    Latents         tensor (B, C, T', h, w) float32, normalized Wan space; starts (latent indices that
                    begin an independent clip: decoders reset there); pad (pixel frames to drop at the end)
    PromptSchedule  prompt embeddings keyed by the pixel frame they start at (parse_schedule: the text form)

RGB frames are ComfyUI IMAGE: float32 (T, H, W, 3) in [0, 1] on the CPU.

Frame arithmetic (Wan's: latent 0 = pixel frame 0 alone, latent i >= 1 = pixel frames 4i-3..4i;
the tiny decoder and the Wan VAE both turn T' latents into 4T'-3 frames, the tiny one by
trimming 3 frames at the start of a stream). A stream of N frames is padded at its end with
copies of its last frame up to 4k+1 frames (pad = (1 - N) mod 4, at most 3: `end_pad`), so k+1
latents carry every frame; `Latents.pad` carries that count through the sampler, and the decoder
drops the pad frames after decoding, so N input frames give exactly N output frames. Padding
happens only at flush, so the result does not depend on how the stream was cut into chunks.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..model_zoo.errors import AlayaError
from ..model_zoo.latents import TIME_COMPRESSION
from ..model_zoo.styles import ORIGINAL, styled
from .gbuffer import DEFAULT_DEPTH_NEAR, LIGHT_PASS_WORLD_KEYS, LIGHT_PASSES, MODALITIES

# ---------------------------------------------------------------------------------------------
# Chunk values.


@dataclass
class GBuffers:
    """A run of G-buffer frames in teacher form: images uint8 (T, 5, H, W, 3), MODALITIES order.

    The light passes an engine may add (streaming/gbuffer.py LIGHT_PASSES), uint8 (T, H, W) or None:
    shadow: the sun's visibility per pixel, 255 lit and 0 in the sun's shadow (an engine's shadow map
    sees casters off the screen, which the shading prior's screen-space shadows cannot); None: the
    prior marches its own.
    sky: the share of the sky each pixel's surface sees, 255 all of it and 0 none (walls, ceilings and
    casters off the screen block it, which the prior's screen-space ambient occlusion cannot see);
    None: the prior's own ambient occlusion."""

    images: torch.Tensor
    fps: float = 16.0
    depth_near: float = DEFAULT_DEPTH_NEAR
    shadow: torch.Tensor | None = None
    sky: torch.Tensor | None = None

    def __post_init__(self):
        if isinstance(self.images, np.ndarray):
            self.images = torch.from_numpy(np.ascontiguousarray(self.images))
        x = self.images
        if x.dtype != torch.uint8 or x.ndim != 5 or x.shape[1] != len(MODALITIES) or x.shape[-1] != 3:
            raise AlayaError(f"G-buffers: expected uint8 (T, 5, H, W, 3) teacher form, got {x.dtype} {tuple(x.shape)}")
        for name in LIGHT_PASSES:
            plane = getattr(self, name)
            if isinstance(plane, np.ndarray):
                plane = torch.from_numpy(np.ascontiguousarray(plane))
                setattr(self, name, plane)
            if plane is not None and (plane.dtype != torch.uint8 or tuple(plane.shape) != (x.shape[0], *x.shape[2:4])):
                raise AlayaError(f"G-buffers: the {name} pass must be uint8 (T, H, W) = {(x.shape[0], *x.shape[2:4])} "
                                 f"like the G-buffers, got {plane.dtype} {tuple(plane.shape)}")

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def size(self) -> tuple[int, int]:
        """(height, width)."""
        return tuple(self.images.shape[2:4])

    def sun_visibility(self) -> torch.Tensor | None:
        """The shadow pass as the shading prior reads it: float (T, H, W) in [0, 1], or None."""
        return None if self.shadow is None else self.shadow.float() / 255

    def sky_visibility(self) -> torch.Tensor | None:
        """The sky pass as the shading prior reads it: float (T, H, W) in [0, 1], or None."""
        return None if self.sky is None else self.sky.float() / 255

    def visibilities(self) -> dict[str, torch.Tensor]:
        """The light passes as the shading prior's keyword arguments (float (T, H, W) in [0, 1])."""
        out = {}
        if self.shadow is not None:
            out["sun_visibility"] = self.sun_visibility()
        if self.sky is not None:
            out["sky_visibility"] = self.sky_visibility()
        return out

    def light_passes(self) -> dict[str, torch.Tensor]:
        """The light passes it carries, by name (LIGHT_PASSES order)."""
        return {name: getattr(self, name) for name in LIGHT_PASSES if getattr(self, name) is not None}

    @classmethod
    def concat(cls, chunks: list["GBuffers"]) -> "GBuffers":
        passes = {}
        for name in LIGHT_PASSES:
            planes = [getattr(c, name) for c in chunks]
            if any(p is None for p in planes) and any(p is not None for p in planes):
                raise AlayaError(f"G-buffers: some chunks carry a {name} pass and some do not; a stream has it all "
                                 "along or never")
            passes[name] = None if planes[0] is None else torch.cat(planes)
        return cls(torch.cat([c.images for c in chunks]), chunks[0].fps, chunks[0].depth_near, **passes)

    def __getitem__(self, frames: slice) -> "GBuffers":
        """The frames of a slice, with their light passes."""
        return GBuffers(self.images[frames], self.fps, self.depth_near,
                        **{name: plane[frames] for name, plane in self.light_passes().items()})

    def pieces(self, n: int) -> list["GBuffers"]:
        """Consecutive pieces of at most n frames."""
        return [self[a:a + n] for a in range(0, len(self), n)] or [self]


@dataclass
class Latents:
    """Latent frames (B, C, T', h, w) float32, normalized Wan space (see module docstring)."""

    tensor: torch.Tensor
    starts: tuple[int, ...] = ()
    pad: int = 0
    fps: float = 16.0

    def __len__(self) -> int:
        return self.tensor.shape[2]

    @classmethod
    def concat(cls, chunks: list["Latents"]) -> "Latents":
        starts, offset = [], 0
        for c in chunks:
            starts += [offset + s for s in c.starts]
            offset += len(c)
        return cls(torch.cat([c.tensor for c in chunks], 2), tuple(starts), sum(c.pad for c in chunks), chunks[0].fps)

    def pieces(self, n: int) -> list["Latents"]:
        """Consecutive pieces of at most n latent frames (starts and pad kept where they fall)."""
        out = []
        for a in range(0, len(self), n):
            b = min(a + n, len(self))
            starts = tuple(s - a for s in self.starts if a <= s < b)
            out.append(Latents(self.tensor[:, :, a:b], starts, self.pad if b == len(self) else 0, self.fps))
        return out

    def split(self) -> list["Latents"]:
        """Pieces that each lie within one clip (a piece starting a clip has starts == (0,))."""
        cuts = sorted(set([0, *self.starts, len(self)]))
        out = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            out.append(Latents(self.tensor[:, :, a:b], (0,) if a in self.starts else (), self.pad if b == len(self) else 0, self.fps))
        return out


# ---------------------------------------------------------------------------------------------
# Prompts: a schedule keyed by pixel frame.

_SCHEDULE_LINE = re.compile(r"^\s*(\d+)\s*:\s*(.*)$")


def parse_schedule(text: str) -> list[tuple[int, str]]:
    """'a sunny street' -> [(0, text)]; lines 'FRAME: prompt' -> a schedule keyed by pixel frame.

    Lines without a 'FRAME:' prefix continue the previous entry. The first entry must start at 0.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # lone surrogates: undecodable bytes from a shell, or "\ud800" in JSON
        raise AlayaError(f"prompt: character {err.start + 1} ({text[err.start]!r}) is not valid Unicode text; "
                         "write the prompt in UTF-8") from None
    entries: list[tuple[int, str]] = []
    for line in text.strip().splitlines():
        m = _SCHEDULE_LINE.match(line)
        if m:
            entries.append((int(m.group(1)), m.group(2).strip()))
        elif entries:
            entries[-1] = (entries[-1][0], (entries[-1][1] + " " + line.strip()).strip())
        elif line.strip():
            entries.append((0, line.strip()))
    if not entries:
        entries = [(0, "")]
    frames = [f for f, _ in entries]
    if frames[0] != 0:
        raise AlayaError(f"prompt schedule: the first entry must be at frame 0, got frame {frames[0]}")
    if frames != sorted(set(frames)):
        raise AlayaError(f"prompt schedule: frames must increase, got {frames}")
    return entries


@dataclass
class PromptSchedule:
    """Prompt embeddings keyed by the pixel frame they start at: [(frame, text, emb (1, L, D))]."""

    entries: list[tuple[int, str, torch.Tensor]]

    @classmethod
    def encode(cls, text_encoder: Callable[[list[str]], torch.Tensor], text: str, style: str = ORIGINAL) -> "PromptSchedule":
        """Each entry's prompt encoded; `style` (AlayaRenderer's, model_zoo/styles.py) swaps each one's lighting part."""
        entries = [(f, styled(t, style)) for f, t in parse_schedule(text)]
        embs = text_encoder([t for _, t in entries])
        return cls([(f, t, embs[i : i + 1]) for i, (f, t) in enumerate(entries)])

    @classmethod
    def constant(cls, emb: torch.Tensor, text: str = "") -> "PromptSchedule":
        return cls([(0, text, emb)])

    def at(self, frame: int) -> tuple[int, torch.Tensor]:
        """(entry index, embedding) in effect at pixel frame `frame`."""
        k = 0
        for i, (f, _, _) in enumerate(self.entries):
            if f <= frame:
                k = i
        return k, self.entries[k][2]

    @property
    def text_dim(self) -> int:
        return self.entries[0][2].shape[-1]


def latent_start_pixel(latent_index: int) -> int:
    """First pixel frame covered by a latent frame (0 -> 0, i -> 4i - 3)."""
    return 0 if latent_index == 0 else TIME_COMPRESSION * latent_index - (TIME_COMPRESSION - 1)


def end_pad(frames: int) -> int:
    """Copies of the last frame that make a clip of `frames` frames 4k+1 long."""
    return (1 - frames) % TIME_COMPRESSION


# ---------------------------------------------------------------------------------------------
# G-buffer chunks from a file stream and from ComfyUI images.


def gbuffer_chunks(stream, length: int) -> Iterator[GBuffers]:
    """GBuffers chunks from a GBufferStream (streaming/files/readers.py), with the light passes it has:
    the first frame alone, then `length` frames at a time. Latent 0 covers frame 0 alone and latent i frames 4i-3..4i, so the
    first frame leaves the renderer as soon as it can, and with `length` a multiple of 4 every later
    chunk completes its latents instead of leaving frames waiting for the next chunk."""
    for images, extras in stream.teacher_chunks(length, first=1, extras=True):
        yield GBuffers(images, stream.info.fps, stream.info.depth_near, **light_passes_of(extras))


def light_passes_of(extras: dict) -> dict[str, np.ndarray]:
    """A chunk's light passes, uint8 (T, H, W) by name, from a stream's stacked extras: a file's passes
    ("shadow", "sky"), or a world's visibilities (float, 1 = seen: "sun_visibility", "sky_visibility")."""
    out = {}
    for name, world_key in LIGHT_PASS_WORLD_KEYS.items():
        if name in extras:
            out[name] = extras[name]
        elif world_key in extras:
            out[name] = np.rint(np.clip(extras[world_key], 0, 1) * 255).astype(np.uint8)
    return out


def gbuffers_from_images(parts: dict[str, torch.Tensor], encoding: str = "teacher",
                         depth_near: float = DEFAULT_DEPTH_NEAR) -> torch.Tensor:
    """Five IMAGE batches (T, H, W, C) float -> teacher form uint8 (T, 5, H, W, 3).

    encoding "teacher": the images already hold the teacher's 8-bit encoding (v / 255);
    "float": canonical values (albedo linear RGB, depth in scene units, normals in [-1, 1] camera
    space, metallic and roughness in [0, 1]), encoded as streaming/gbuffer.py does. Single-channel
    passes read channel 0.
    """
    from .gbuffer import encode_depth, encode_normal, linear_to_srgb

    if encoding not in ("teacher", "float"):
        raise AlayaError(f"G-buffer image encoding {encoding!r} is not one of teacher, float")
    shapes = {m: tuple(parts[m].shape) for m in MODALITIES}
    t, h, w = shapes["albedo"][:3]
    for m, shape in shapes.items():
        if len(shape) != 4 or shape[:3] != (t, h, w):
            raise AlayaError(f"G-buffer images: {m} is {shape}, expected ({t}, {h}, {w}, C) like albedo")
        if m in ("albedo", "normal") and shape[3] < 3:
            raise AlayaError(f"G-buffer images: {m} needs 3 channels, got {shape[3]}")
    x = {m: parts[m].detach().float().cpu().numpy() for m in MODALITIES}

    def u8(v):
        return np.clip(np.rint(v * 255.0), 0, 255).astype(np.uint8)

    def gray3(v):
        return np.repeat(v[..., None], 3, axis=-1)

    if encoding == "teacher":
        planes = [u8(x["albedo"][..., :3]), gray3(u8(x["depth"][..., 0])), gray3(u8(x["metallic"][..., 0])),
                  u8(x["normal"][..., :3]), gray3(u8(x["roughness"][..., 0]))]
    else:
        planes = [u8(linear_to_srgb(x["albedo"][..., :3])), gray3(encode_depth(x["depth"][..., 0], depth_near)),
                  gray3(u8(np.clip(x["metallic"][..., 0], 0, 1))), encode_normal(x["normal"][..., :3]),
                  gray3(u8(np.clip(x["roughness"][..., 0], 0, 1)))]
    return torch.from_numpy(np.stack(planes, axis=1))
