"""Image and video quality metrics for evaluation (the seed paper's five axes, computable on a CPU).

Frames are float tensors (T, H, W, 3) in [0, 1] (ComfyUI IMAGE layout, what the pipelines emit).

- psnr / ssim: content preservation (SSIM: Gaussian window 11, sigma 1.5, on luma-free RGB mean
  over channels, constants of Wang et al. 2004); psnr_by_latent: PSNR of each latent frame's pixel
  frames (frame 0, then 1-4, 5-8, ...), which shows drift along a stream.
- temporal: error of frame-to-frame differences against the reference's, and the ratio of their
  mean magnitudes (1.0 = as much change as the ground truth; > 1 = flicker).
- psnr_by_scale: PSNR with the render's content coarser than k pixels replaced by the truth's, for
  several k: which scales the error lives at (a render whose light is right and detail wrong gains
  much at large k; one whose detail is right and light wrong only at small k).
- boundary_ratio: mean change across chunk boundaries over mean change inside chunks.
- nearest: which reference (e.g. ground truth under each lighting preset) a render is closest to,
  and the PSNR margin to the runner-up (prompt controllability).
- shadow_ratio: luminance of shadowed over sunlit pixels given the scene's sun visibility (do
  renders keep cast shadows?).
- edge_free: a region's pixels away from its edges and from shadow edges (where pixel filters blend).
- region_contrast: std / mean of linear luminance over a region (metals that reflect their
  surroundings and carry highlights are high; matte, flat shading is low).
- region_psnr: PSNR over a region's pixels only.
- region_colour: mean sRGB colour over a region (e.g. the sky's pixels).
- lighting: the three above for one render against its ground truth, with the regions taken from
  the clip's G-buffers (metal: metallic >= 0.9; sky: background depth) and, for shadows, the
  scene's sun visibility and ground mask (world v2 datasets carry both).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..model_zoo.latents import TIME_COMPRESSION


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB over the whole clip (peak 1.0); inf for identical inputs."""
    return _psnr_of_mse(F.mse_loss(x.float(), ref.float()).item())


def _psnr_of_mse(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def noise_free_psnr(x: torch.Tensor, ref: torch.Tensor, ref_noise_mse: float) -> float:
    """PSNR (peak 1.0) of x against the noise-free image of which `ref` is a noisy estimate (a path-traced
    truth) whose noise has mean square `ref_noise_mse`: a render independent of that noise has expected
    MSE against ref = MSE against the noise-free image + ref_noise_mse, so the difference estimates it
    (floored at a hundredth of the noise: a render cannot be told apart from the truth below that)."""
    mse = F.mse_loss(x.float(), ref.float()).item()
    return _psnr_of_mse(max(mse - ref_noise_mse, 0.01 * ref_noise_mse))


def latent_frame_groups(frames: int) -> list[slice]:
    """The pixel frames of each latent frame in Wan's alignment: [0], [1, 4], [5, 8], ... (the last may be short)."""
    starts = [0] + list(range(1, frames, TIME_COMPRESSION))
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [frames])]


def psnr_by_latent(x: torch.Tensor, ref: torch.Tensor) -> list[float]:
    """PSNR of the pixel frames of each latent frame (latent_frame_groups)."""
    return [psnr(x[g], ref[g]) for g in latent_frame_groups(x.shape[0])]


def _gauss(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    g = torch.exp(-((torch.arange(size) - size // 2) ** 2).float() / (2 * sigma**2))
    return (g / g.sum())[None, None]


def ssim(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean SSIM over frames and channels: x, ref (T, H, W, 3) in [0, 1]."""
    a = x.float().permute(0, 3, 1, 2).flatten(0, 1)[:, None]  # (T*3, 1, H, W)
    b = ref.float().permute(0, 3, 1, 2).flatten(0, 1)[:, None]
    size = min(11, a.shape[-1], a.shape[-2])
    size -= 1 - size % 2  # odd
    g = _gauss(size)

    def blur(v):  # separable Gaussian, valid region
        return F.conv2d(F.conv2d(v, g[..., None, :].reshape(1, 1, 1, -1)), g.reshape(1, 1, -1, 1))

    c1, c2 = 0.01**2, 0.03**2
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.mean().item()


def temporal(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Frame-difference error (mean |dx - dref|) and magnitude ratio (mean |dx| / mean |dref|)."""
    dx, dr = x[1:].float() - x[:-1].float(), ref[1:].float() - ref[:-1].float()
    return {"diff_error": (dx - dr).abs().mean().item(),
            "ratio": dx.abs().mean().item() / max(dr.abs().mean().item(), 1e-8)}


SCALES = (128, 64, 32, 16, 8, 4)  # psnr_by_scale's cell sizes in pixels (8: one latent's pixels)


def _coarse(x: torch.Tensor, k: int) -> torch.Tensor:
    """The content of frames (T, H, W, 3) coarser than k pixels: means over k x k cells (a side that k
    does not divide is cut into ceil(side / k) near-equal cells), bilinearly upsampled."""
    planes = x.permute(0, 3, 1, 2)
    h, w = planes.shape[-2:]
    cells = F.adaptive_avg_pool2d(planes, (-(-h // k), -(-w // k)))
    return F.interpolate(cells, size=(h, w), mode="bilinear", align_corners=False).permute(0, 2, 3, 1)


def psnr_by_scale(x: torch.Tensor, ref: torch.Tensor, scales=SCALES) -> dict[int, float]:
    """{k: PSNR of x with its content coarser than k pixels swapped for ref's}, in linear light (where
    light adds), scored in sRGB as psnr. The gain over psnr(x, ref) at each k is what getting the
    coarser scales right would buy."""
    from .gbuffer import linear_to_srgb, srgb_to_linear

    lx, lref = (torch.from_numpy(srgb_to_linear(_numpy(v.float()))) for v in (x, ref))
    return {k: psnr(torch.from_numpy(linear_to_srgb((lx - _coarse(lx, k) + _coarse(lref, k)).numpy())), ref)
            for k in scales}


def boundary_ratio(x: torch.Tensor, boundaries: list[int]) -> float | None:
    """Mean |x[b] - x[b-1]| over boundary frames b, over the same inside chunks; None without both kinds."""
    d = (x[1:].float() - x[:-1].float()).abs().flatten(1).mean(1)  # d[i] = change from frame i to i+1
    at = [b - 1 for b in boundaries if 0 < b < x.shape[0]]
    inside = [i for i in range(d.shape[0]) if i not in at]
    if not at or not inside:
        return None
    return d[at].mean().item() / max(d[inside].mean().item(), 1e-8)


def nearest(x: torch.Tensor, refs: list[torch.Tensor], target: int) -> dict:
    """Is x nearest (by PSNR) to refs[target]? margin = PSNR to target - best PSNR to any other (dB);
    nearest = the index of the closest ref."""
    scores = [psnr(x, r) for r in refs]
    others = [s for i, s in enumerate(scores) if i != target]
    best = max(range(len(scores)), key=scores.__getitem__)
    return {"hit": best == target, "nearest": best, "margin_db": scores[target] - max(others) if others else math.inf}


def _numpy(x):
    import numpy as np

    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _unit(x):
    """float32 numpy in [0, 1] from uint8 0-255 or float values (numpy or torch)."""
    import numpy as np

    x = _numpy(x)
    return x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)


def _linear_luminance(rgb):
    """Rec. 709 luminance of sRGB values (uint8, or float in [0, 1]), decoded to linear."""
    import numpy as np

    from .gbuffer import srgb_to_linear

    return srgb_to_linear(_unit(rgb)) @ np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)


def shadow_ratio(rgb, sun_visibility, region=None, min_pixels: int = 16) -> float | None:
    """How dark cast shadows are: mean luminance of shadowed pixels over that of sunlit ones.

    rgb: one frame (H, W, 3), uint8 sRGB or float in [0, 1] (numpy or torch); sun_visibility:
    (H, W) in [0, 1] (or uint8 0-255) from the scene (world v2 frames carry it as extras["sun_visibility"]);
    region: optional (H, W) bool mask, e.g. the ground's pixels. Shadowed means visibility < 0.01,
    lit > 0.99. Luminance is Rec. 709 on linear values (sRGB decoded). About 1.0: no visible
    shadows; ground truth on a sunny street is far below. None when either set has fewer than
    min_pixels pixels.
    """
    import numpy as np

    vis = _unit(sun_visibility)
    lum = _linear_luminance(rgb)
    keep = np.ones(vis.shape, bool) if region is None else np.asarray(region, bool)
    shadowed, lit = keep & (vis < 0.01), keep & (vis > 0.99)
    if shadowed.sum() < min_pixels or lit.sum() < min_pixels:
        return None
    return float(lum[shadowed].mean() / max(lum[lit].mean(), 1e-8))


def edge_free(region, sun_visibility):
    """The region's pixels whose 3x3 neighbourhood is all in the region and all lit, all shadowed or
    all between: region (H, W) bool, sun_visibility (H, W) as shadow_ratio's. A renderer's pixel
    filter (path tracers, Cycles) blends the pixels along an object's or a shadow's edge, the masks
    from the pixel centres do not, so shadow ratios are measured away from those edges."""
    import numpy as np

    vis = _unit(sun_visibility)
    kind = np.where(vis < 0.01, 0, np.where(vis > 0.99, 2, 1))
    inside = _numpy(region).astype(bool)
    h, w = kind.shape
    pad_in, pad_kind = np.pad(inside, 1, mode="edge"), np.pad(kind, 1, mode="edge")
    keep = inside.copy()
    for di in range(3):
        for dj in range(3):
            keep &= pad_in[di:di + h, dj:dj + w] & (pad_kind[di:di + h, dj:dj + w] == kind)
    return keep


def region_contrast(rgb, mask, min_pixels: int = 16) -> float | None:
    """Std / mean of linear luminance over the mask's pixels: rgb (..., H, W, 3) as shadow_ratio's,
    mask (..., H, W) bool (one frame or a clip). None with fewer than min_pixels pixels."""
    mask = _numpy(mask).astype(bool)
    if mask.sum() < min_pixels:
        return None
    lum = _linear_luminance(rgb)[mask]
    return float(lum.std() / max(lum.mean(), 1e-8))


def region_psnr(x, ref, mask) -> float | None:
    """PSNR (peak 1.0) over the mask's pixels only: x, ref (..., H, W, 3) uint8 or float in [0, 1],
    mask (..., H, W) bool; None for an empty mask."""
    mask = _numpy(mask).astype(bool)
    if not mask.any():
        return None
    return _psnr_of_mse(float(((_unit(x)[mask] - _unit(ref)[mask]) ** 2).mean()))


def region_colour(rgb, mask, min_pixels: int = 16):
    """Mean sRGB colour (3,) in [0, 1] over the mask's pixels (rgb and mask as region_contrast's),
    or None with fewer than min_pixels pixels."""
    mask = _numpy(mask).astype(bool)
    if mask.sum() < min_pixels:
        return None
    return _unit(rgb)[mask].mean(0)


METAL_MIN = 0.9  # metallic at least this: bare metal (world v2's painted metal is 0.5-0.9)


def lighting(render, truth, gbuffers, sun_visibility=None, ground=None) -> dict:
    """What PSNR misses, for one render (T, H, W, 3) against its ground truth (same layout):

    shadow_ratio / gt_shadow_ratio  mean over frames of shadow_ratio on the ground's pixels away
                                    from edges (edge_free; sun_visibility (T, H, W) in [0, 1] or
                                    uint8 0-255, ground (T, H, W) bool; None without them or
                                    without enough pixels)
    metal_contrast / gt_...         region_contrast over the clip's bare-metal pixels
    metal_psnr_db                   PSNR over those pixels
    sky_colour / gt_sky_colour      region_colour over the background's pixels (sRGB, 0-1)
    sky_error_levels                mean |difference| of those colours per channel, in 8-bit levels

    gbuffers: the clip's teacher-form G-buffers (T, 5, H, W, 3) uint8 (MODALITIES order): metal is
    metallic >= METAL_MIN, sky the depth's 0 (background)."""
    import numpy as np

    from .gbuffer import MODALITIES

    gb = _numpy(gbuffers)
    render, truth = _unit(render), _unit(truth)
    sky = gb[:, MODALITIES.index("depth"), ..., 0] == 0
    metal = (gb[:, MODALITIES.index("metallic"), ..., 0] >= round(255 * METAL_MIN)) & ~sky
    out = {"shadow_ratio": None, "gt_shadow_ratio": None}
    if sun_visibility is not None and ground is not None:
        regions = [(v, edge_free(g, v)) for v, g in zip(_numpy(sun_visibility), _numpy(ground))]
        pairs = [(shadow_ratio(r, v, k), shadow_ratio(t, v, k)) for r, t, (v, k) in zip(render, truth, regions)]
        pairs = [(r, t) for r, t in pairs if r is not None and t is not None]
        if pairs:
            out = {"shadow_ratio": float(np.mean([r for r, _ in pairs])),
                   "gt_shadow_ratio": float(np.mean([t for _, t in pairs]))}
    out["metal_contrast"] = region_contrast(render, metal)
    out["gt_metal_contrast"] = region_contrast(truth, metal)
    out["metal_psnr_db"] = region_psnr(render, truth, metal) if out["metal_contrast"] is not None else None
    colour, gt_colour = region_colour(render, sky), region_colour(truth, sky)
    out["sky_colour"] = None if colour is None else colour.tolist()
    out["gt_sky_colour"] = None if gt_colour is None else gt_colour.tolist()
    out["sky_error_levels"] = None if colour is None else float(np.abs(colour - gt_colour).mean() * 255)
    return out
