"""Real Blender exports: tests/data/engines/blender{4,5}/, rendered by integrations/blender/blender_fixtures.py
with the bpy wheels 4.5.4 LTS and 5.0.1 (Cycles, 16x16, 3 frames, known scene and materials),
set up by the Blender add-on integrations/blender/alaya_flash_blender_addon.py (passes, AOVs fed from the
Principled BSDF, one of them through a link, multilayer EXR, camera.json).

What the files themselves show (and these tests pin): Blender 4.5 writes multilayer EXR as one
part with `ViewLayer.DiffCol.R`; Blender 5.0 writes one part per pass with `ViewLayer.Diffuse
Color.R`; the Depth pass is planar (the floor seen straight down from 5 m is 5.0 in every pixel);
background depth is 1e10 and background normal (0, 0, 0); value AOVs are channel X, colour AOVs
R, G, B, A.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from alaya_flash.streaming.files.image_files import read_exr, write_exr
from alaya_flash.streaming.files.readers import open_gbuffers

DATA = Path(__file__).parent / "data" / "engines"
VERSIONS = ["blender4", "blender5"]
FLOOR = dict(albedo=(0.8, 0.2, 0.1), metallic=0.0, roughness=0.7)
METAL = dict(albedo=(0.9, 0.9, 0.9), metallic=1.0, roughness=0.2)


def _camera(folder: Path):
    data = json.loads((folder / "camera.json").read_text())
    return [np.array(m) for m in data["camera_to_world"]], data["fov_y_deg"]


def _floor_depth(c2w: np.ndarray, fov_y_deg: float, h: int, w: int) -> np.ndarray:
    """Planar depth of the ground plane z=0 per pixel (OpenGL camera rays), +inf where it is not hit."""
    f = (h / 2) / np.tan(np.radians(fov_y_deg) / 2)
    x = (np.arange(w) + 0.5 - w / 2) / f
    y = -(np.arange(h) + 0.5 - h / 2) / f
    d = np.stack(np.broadcast_arrays(x[None, :], y[:, None], -np.ones((h, w))), -1)  # z = -1: t is planar depth
    dz = d @ c2w[:3, :3].T[:, 2]
    with np.errstate(divide="ignore"):
        t = -c2w[2, 3] / dz
    return np.where(t > 0, t, np.inf)


def _interior(mask: np.ndarray) -> np.ndarray:
    """Pixels whose 8 neighbours share the mask (the pixel filter blends values across edges)."""
    m = np.pad(mask, 1)
    out = mask.copy()
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            out &= m[1 + dy:1 + dy + mask.shape[0], 1 + dx:1 + dx + mask.shape[1]]
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_real_blender_export_reads_to_canonical(version, caplog):
    folder = DATA / version
    import OpenEXR

    with OpenEXR.File(str(folder / "0001.exr"), header_only=True) as f:
        assert len(f.parts) == (7 if version == "blender5" else 1)  # Blender 5: one part per pass
    from alaya_flash.streaming.files.image_files import exr_software

    assert exr_software(folder / "0001.exr").startswith("Blender")  # 4: BlenderMultiChannel; 5: Software
    with caplog.at_level(logging.INFO):
        frames = list(open_gbuffers(folder))
    assert "conventions auto: blender" in caplog.text
    assert "WARNING" not in caplog.text  # the albedo AOV wins over Diffuse Color: no black-metal warning
    mats, fov = _camera(folder)
    for i, f in enumerate(frames):
        floor = _interior((f.metallic == 0) & (f.roughness == np.float32(0.7)) & np.isfinite(f.depth))
        metal = _interior((f.metallic == 1) & np.isfinite(f.depth))
        assert floor.sum() > 20
        np.testing.assert_allclose(f.albedo[floor], np.broadcast_to(FLOOR["albedo"], f.albedo[floor].shape), atol=1e-6)
        if metal.any():
            np.testing.assert_allclose(f.roughness[metal], 0.2, atol=1e-6)
            np.testing.assert_allclose(f.albedo[metal], 0.9, atol=1e-6)
        # depth in metres, planar: the analytic depth of the ground plane
        np.testing.assert_allclose(f.depth[floor], _floor_depth(mats[i], fov, 16, 16)[floor], rtol=2e-3)
        # normals: world +Z (the floor) seen from this camera
        up = np.linalg.inv(mats[i][:3, :3]) @ [0, 0, 1]
        np.testing.assert_allclose(f.normal[floor], np.broadcast_to(up, f.normal[floor].shape), atol=1e-5)
        assert "rgb" in f.extras
    assert (frames[0].depth[np.isfinite(frames[0].depth) & (frames[0].metallic == 0)] == 5.0).all()  # planar Z
    np.testing.assert_allclose(frames[1].normal[8, 8], [0, np.sin(np.radians(30)), np.cos(np.radians(30))], atol=1e-5)
    sky = read_exr(folder / "0003.exr")["ViewLayer.Depth.Z"] >= 1e10
    assert sky.sum() > 16 and np.isposinf(frames[2].depth[sky]).all()
    assert (frames[2].normal[sky] == [0, 0, 1]).all()


@pytest.mark.parametrize("version", VERSIONS)
def test_real_blender_diffuse_colour_only_warns_on_metals(version, tmp_path, caplog):
    """Without the albedo AOV the reader falls back to Diffuse Color, which Blender makes black on metals."""
    d = tmp_path / version
    d.mkdir()
    shutil.copy(DATA / version / "camera.json", d)
    for p in sorted((DATA / version).glob("*.exr")):
        chans = {k: v for k, v in read_exr(p).items() if ".albedo." not in k}
        write_exr(d / p.name, chans)
    with caplog.at_level(logging.WARNING):
        frames = list(open_gbuffers(d))
    assert "albedo is black on" in caplog.text
    metal = frames[0].metallic == 1
    assert (frames[0].albedo[metal] == 0).all()
