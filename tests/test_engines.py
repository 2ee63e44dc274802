"""Engine exports in: Blender (multilayer, multi-part), Unreal MRQ and Unity HDRP AOV layouts.

Fixtures are written by the tests with OpenEXR to each engine's documented channel and file
layout (docs/gbuffers.md, Engines): no engine is run here. Ground truth is a canonical frame
(camera-space OpenGL normals, planar depth in metres); each engine's form is made from it by the
inverse of the documented convention, and hand-computed cases pin the axes independently.
"""
from __future__ import annotations

import json
import re
import logging

import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files import conventions as cv
from alaya_flash.streaming.files.image_files import read_exr, write_exr, write_exr_parts
from alaya_flash.streaming.files.readers import open_gbuffers

H = W = 16
N = 3


def _rot(axis: str, deg: float) -> np.ndarray:
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return {"x": np.array([[1, 0, 0], [0, c, -s], [0, s, c]]),
            "y": np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]]),
            "z": np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])}[axis]


def _c2w(i: int) -> np.ndarray:
    """A camera that turns and pitches from frame to frame (engine world axes)."""
    return _rot("z", 25.0 * i) @ _rot("x", 70.0 + 5 * i)


def truth(i: int, rng=None):
    """Canonical passes for frame i: normals facing the camera, depth 1..5 m, sky in the top 3 rows."""
    rng = rng or np.random.default_rng(100 + i)
    n = rng.normal(size=(H, W, 3))
    n[..., 2] = np.abs(n[..., 2]) + 0.5
    n /= np.linalg.norm(n, axis=-1, keepdims=True)
    depth = rng.uniform(1.0, 5.0, (H, W))
    depth[:3] = np.inf
    n[:3] = (0, 0, 1)
    return dict(albedo=rng.uniform(0.05, 0.9, (H, W, 3)), depth=depth, normal=n,
                metallic=rng.uniform(0, 1, (H, W)), roughness=rng.uniform(0, 1, (H, W)))


def world_normals(n_gl: np.ndarray, c2w: np.ndarray, axes: str) -> np.ndarray:
    """The inverse of the reader: canonical camera normals -> the engine's world normals."""
    n_cam = n_gl @ cv.CAMERA_AXES[axes]  # A^T @ n (A is orthogonal)
    return n_cam @ c2w.T


def write_camera(folder, mats, axes=None, key="camera_to_world", **extra):
    data = {key: [np.asarray(m, float).tolist() for m in mats], **extra}
    if axes:
        data["camera_axes"] = axes
    (folder / "camera.json").write_text(json.dumps(data))


def check_frames(frames, scale_albedo=None):
    assert len(frames) == N
    for i, f in enumerate(frames):
        t = truth(i)
        fg = np.isfinite(t["depth"])
        np.testing.assert_allclose(f.normal[fg], t["normal"][fg], atol=1e-5)
        np.testing.assert_allclose(f.depth[fg], t["depth"][fg], rtol=1e-5)
        assert np.isposinf(f.depth[~fg]).all()
        np.testing.assert_allclose(f.metallic, t["metallic"], atol=1e-6)
        np.testing.assert_allclose(f.albedo, t["albedo"], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Blender: multilayer EXR, view-layer prefixes; Blender 5 writes one part per pass.


def blender_frame(i: int, diffcol_only=False, z_up_floor=False):
    t = truth(i)
    depth = np.where(np.isfinite(t["depth"]), t["depth"], 1e10)  # Blender's background Z
    n = world_normals(t["normal"], _c2w(i), "opengl")
    passes = {
        "ViewLayer.Combined": {"R": t["albedo"][..., 0], "G": t["albedo"][..., 1], "B": t["albedo"][..., 2],
                               "A": np.ones((H, W))},
        "ViewLayer.Depth": {"Z": depth},
        "ViewLayer.Normal": {"X": n[..., 0], "Y": n[..., 1], "Z": n[..., 2]},
        "ViewLayer.DiffCol": {c: t["albedo"][..., k] * (t["metallic"] < 0.5) for k, c in enumerate("RGB")},
        "ViewLayer.metallic": {"X": t["metallic"]},
        "ViewLayer.roughness": {"X": t["roughness"]},
    }
    if not diffcol_only:
        passes["ViewLayer.albedo"] = {c: t["albedo"][..., k] for k, c in enumerate("RGB")}
    return passes


def write_blender(folder, multipart=True, **kw):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(N):
        passes = blender_frame(i, **kw)
        path = folder / f"{i + 1:04d}.exr"
        if multipart:  # Blender 5: one part per pass, full channel names
            write_exr_parts(path, {p: {f"{p}.{c}": v for c, v in ch.items()} for p, ch in passes.items()})
        else:  # Blender 4: one part, every channel prefixed
            write_exr(path, {f"{p}.{c}": v for p, ch in passes.items() for c, v in ch.items()})
    write_camera(folder, [_c2w(i) for i in range(N)])
    return folder


@pytest.mark.parametrize("multipart", [True, False], ids=["blender5-multipart", "blender4-singlepart"])
def test_blender_multilayer_reads_to_canonical(tmp_path, caplog, multipart):
    d = write_blender(tmp_path / "bl", multipart=multipart)
    with caplog.at_level(logging.INFO):
        stream = open_gbuffers(d)
    assert "conventions auto: blender" in caplog.text
    assert "blender conventions" in stream.source.description
    frames = list(stream)
    check_frames(frames)
    assert frames[0].extras["rgb"].dtype == np.uint8  # Combined -> rgb ground truth


def test_multipart_parts_with_bare_channel_names(tmp_path):
    """Parts whose channels carry no layer prefix are named by their part: Depth part, channel Z -> Depth.Z."""
    d = tmp_path / "bare"
    d.mkdir()
    for i in range(N):
        passes = blender_frame(i)
        write_exr_parts(d / f"{i:04d}.exr", passes)  # channel names "Z", "X", ... inside named parts
    write_camera(d, [_c2w(i) for i in range(N)])
    assert "ViewLayer.Depth.Z" in read_exr(d / "0000.exr")
    check_frames(list(open_gbuffers(d, conventions="blender")))


def test_multipart_missing_pass_names_channels_of_every_part(tmp_path):
    d = tmp_path / "mp"
    d.mkdir()
    passes = blender_frame(0)
    del passes["ViewLayer.roughness"]
    write_exr_parts(d / "0001.exr", {p: {f"{p}.{c}": v for c, v in ch.items()} for p, ch in passes.items()})
    with pytest.raises(AlayaError, match=r"lacks modality roughness \(channels: .*ViewLayer\.Combined\.A.*"
                                         r"ViewLayer\.Normal\.Z.*ViewLayer\.metallic\.X"):
        open_gbuffers(d)


def test_blender_hand_computed_axes(tmp_path):
    """Blender camera rotated 90 degrees about X looks along world +Y: world up (+Z) is camera up,
    world -Y faces the camera, world +X is camera right."""
    d = tmp_path / "hand"
    d.mkdir()
    n = np.zeros((H, W, 3))
    n[:, :5] = (0, 0, 1)
    n[:, 5:10] = (0, -1, 0)
    n[:, 10:] = (1, 0, 0)
    t = truth(0)
    passes = {"ViewLayer.Depth": {"Z": np.full((H, W), 2.0)},
              "ViewLayer.Normal": {"X": n[..., 0], "Y": n[..., 1], "Z": n[..., 2]},
              "ViewLayer.albedo": {c: t["albedo"][..., k] for k, c in enumerate("RGB")},
              "ViewLayer.metallic": {"X": t["metallic"]}, "ViewLayer.roughness": {"X": t["roughness"]}}
    write_exr_parts(d / "0001.exr", {p: {f"{p}.{c}": v for c, v in ch.items()} for p, ch in passes.items()})
    m = np.eye(4)
    m[:3, :3] = _rot("x", 90)
    m[:3, 3] = (1, -5, 1.5)  # translation does not touch normals
    (d / "camera.json").write_text(json.dumps({"camera_to_world": m.tolist()}))  # one static camera
    f = next(iter(open_gbuffers(d)))
    np.testing.assert_allclose(f.normal[0, 0], (0, 1, 0), atol=1e-6)
    np.testing.assert_allclose(f.normal[0, 7], (0, 0, 1), atol=1e-6)
    np.testing.assert_allclose(f.normal[0, 12], (1, 0, 0), atol=1e-6)
    # the same camera given as world_to_camera
    (d / "camera.json").write_text(json.dumps({"world_to_camera": np.linalg.inv(m).tolist()}))
    np.testing.assert_allclose(next(iter(open_gbuffers(d))).normal[0, 7], (0, 0, 1), atol=1e-6)


def test_blender_file_output_names_and_diffuse_color(tmp_path):
    """Blender File Output node default names (`albedo0001.exr`, input name + frame) with Blender 5's
    long pass name `Diffuse Color` inside."""
    d = tmp_path / "fo"
    d.mkdir()
    for i in range(N):
        t = truth(i)
        depth = np.where(np.isfinite(t["depth"]), t["depth"], 1e10)
        n = world_normals(t["normal"], _c2w(i), "opengl")
        write_exr(d / f"albedo{i + 1:04d}.exr", {f"ViewLayer.Diffuse Color.{c}": t["albedo"][..., k]
                                                for k, c in enumerate("RGB")})
        write_exr(d / f"depth{i + 1:04d}.exr", {"V": depth})
        write_exr(d / f"normal{i + 1:04d}.exr", {c: n[..., k] for k, c in enumerate("RGB")})
        write_exr(d / f"metallic{i + 1:04d}.exr", {"V": t["metallic"]})
        write_exr(d / f"roughness{i + 1:04d}.exr", {"V": t["roughness"]})
    write_camera(d, [_c2w(i) for i in range(N)])
    stream = open_gbuffers(d)  # auto: the Diffuse Color channel names say Blender
    assert stream.source.convention.name == "blender"
    check_frames(list(stream))


def test_black_albedo_on_metal_warns(tmp_path, caplog):
    d = write_blender(tmp_path / "dc", diffcol_only=True)
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(d))
    assert "albedo is black on" in caplog.text and "export the base colour" in caplog.text


def test_world_normals_without_camera_json(tmp_path, caplog):
    d = write_blender(tmp_path / "nocam")
    (d / "camera.json").unlink()
    with pytest.raises(AlayaError, match=r"blender normals are in world space and no camera.json .* write camera.json "
                                         r"beside the passes .*gbuffers convert FOLDER OUT --to png --world-normals keep"):
        open_gbuffers(d)
    with caplog.at_level(logging.WARNING):
        frames = list(open_gbuffers(d, world_normals="keep"))
    assert "using them unconverted" in caplog.text
    n = world_normals(truth(1)["normal"], _c2w(1), "opengl")
    np.testing.assert_allclose(frames[1].normal[5:], n[5:], atol=1e-5)


def test_the_world_normals_advice_is_one_render_takes(tmp_path, capsys):
    """`render` on a Blender folder without camera.json advised `--world-normals keep`, which render
    does not accept; the advice now is a command that works, and following it renders."""
    from alaya_flash.streaming.cli import main

    d = write_blender(tmp_path / "nocam")
    (d / "camera.json").unlink()
    render = ["--prompt", "x", "--size", "32", "--frames", "3", "--out"]
    assert main(["--quiet", "render", str(d), *render, str(tmp_path / "a.mp4")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    advice = re.search(r"`alaya-flash (gbuffers convert FOLDER OUT [^`]*)`", err).group(1)
    command = advice.replace("FOLDER", str(d)).replace("OUT", str(tmp_path / "kept")).split()
    assert main(["--quiet", *command]) == 0
    assert main(["--quiet", "render", str(tmp_path / "kept"), *render, str(tmp_path / "b.mp4")]) == 0
    assert (tmp_path / "b.mp4").is_file()


@pytest.mark.parametrize("writer, forced, expected", [
    ("unreal", "unity", "depth is exactly 65504 (the float16 maximum, Unreal's background) at"),
    ("unreal", "blender", "depth is exactly 65504"),
    ("unity", "unreal", "99% of the depth is nearer than 10 cm (0.0103 to 0.0497 m): the unreal convention reads "
                        "depth in units of 0.01 m"),
    ("blender", "unreal", "99% of the depth is nearer than 10 cm"),
])
def test_a_forced_wrong_engine_warns_about_depth(tmp_path, caplog, writer, forced, expected):
    """Forcing the wrong engine gave no depth warning while depth came out 100x off and the sky was
    not background (the plausibility checks caught only `alaya` on Blender files)."""
    d = {"unreal": write_unreal, "unity": write_unity, "blender": write_blender}[writer](tmp_path / writer)
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(d, conventions=forced))
    assert expected in caplog.text and caplog.text.count(expected) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(d))  # the right engine: no depth warning
    assert "background marker" not in caplog.text and "nearer than 10 cm" not in caplog.text


def test_bad_camera_json_is_one_line(tmp_path):
    d = write_blender(tmp_path / "badcam")
    (d / "camera.json").write_text(json.dumps({"camera_to_world": [[1, 0], [0, 1]]}))
    with pytest.raises(AlayaError, match=r"camera.json: camera_to_world: expected a 4x4 or 3x3 matrix"):
        open_gbuffers(d)
    write_camera(d, [_c2w(0)])  # one matrix in a per-frame list for three frames
    (d / "camera.json").write_text(json.dumps({"camera_to_world": [_c2w(0).tolist(), _c2w(1).tolist()]}))
    with pytest.raises(AlayaError, match=r"camera.json: has 2 camera frames, frame 2 needs one"):
        list(open_gbuffers(d))


@pytest.mark.parametrize("matrix, message", [
    ("identity", 'expected a 4x4 or 3x3 matrix of numbers (rows of numbers), got "identity"'),  # was a ValueError
    ([["1", "0", "0"], ["0", "1", "0"], ["0", "0", "1"]], 'got [["1", "0", "0"], ["0", "1", "0"]'),
    ([[1, 0, 0], [0, 1], [0, 0, 1]], "got 3 row(s) of [2, 3] number(s)"),
    ([[float("nan")] * 4] * 4, "has a value that is not a finite number (NaN or infinity)"),  # said "got shape (4, 4)"
    ([[1, 0, 0], [0, 0, 0], [0, 0, 1]], "the rotation part (upper-left 3x3) is singular"),
    ([[True, 0, 0], [0, 1, 0], [0, 0, 1]], "expected a 4x4 or 3x3 matrix of numbers"),
])
def test_a_camera_matrix_that_is_not_one_is_one_line(tmp_path, matrix, message):
    d = write_blender(tmp_path / "badcam")
    (d / "camera.json").write_text(json.dumps({"camera_to_world": matrix}))
    with pytest.raises(AlayaError, match=re.escape("camera.json: camera_to_world: ") + ".*" + re.escape(message)):
        open_gbuffers(d)
    (d / "camera.json").write_text(json.dumps({"world_to_camera": [_c2w(0).tolist(), matrix]}))
    with pytest.raises(AlayaError, match=re.escape("camera.json: world_to_camera[1]: ") + ".*" + re.escape(message)):
        open_gbuffers(d)


@pytest.mark.parametrize("text, message", [
    (json.dumps({"camera_to_world": np.eye(4).tolist(), "camera_axes": ["opengl"]}),
     'camera_axes ["opengl"] is not one of opengl, unreal, unity'),  # was a TypeError (unhashable)
    (json.dumps({"camera_to_world": np.eye(4).tolist(), "camera_axes": {}}), "camera_axes {} is not one of"),
    ('{"camera_to_world": ' + "[" * 5000 + "]" * 5000 + "}",  # was a RecursionError
     "not a readable camera JSON (nested too deeply to read"),
])
def test_a_camera_json_of_the_wrong_shape_is_one_line(tmp_path, text, message):
    d = write_blender(tmp_path / "badcam")
    (d / "camera.json").write_text(text)
    with pytest.raises(AlayaError, match=re.escape(message)) as err:
        open_gbuffers(d)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# Unreal Movie Render Queue: {sequence}.{render_pass}.{frame}.exr, centimetres, left-handed Z up.


def write_unreal(folder, per_pass_folders=False, unsigned_normals=False):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(N):
        t = truth(i)
        depth = np.where(np.isfinite(t["depth"]), t["depth"] * 100.0, 65504.0)  # cm; half-float max at the sky
        n = world_normals(t["normal"], _c2w(i), "unreal")
        if unsigned_normals:
            n = n * 0.5 + 0.5
        one = np.ones((H, W))
        rgba = lambda x: {"R": x[..., 0], "G": x[..., 1], "B": x[..., 2], "A": one}  # noqa: E731
        gray = lambda x: {"R": x, "G": x, "B": x, "A": one}  # noqa: E731
        for name, chans in {"FinalImage": rgba(t["albedo"]), "BaseColor": rgba(t["albedo"]), "SceneDepth": gray(depth),
                            "WorldNormal": rgba(n), "Metallic": gray(t["metallic"]),
                            "Roughness": gray(t["roughness"])}.items():
            if per_pass_folders:
                (folder / name).mkdir(exist_ok=True)
                write_exr(folder / name / f"Shot.{i:04d}.exr", chans)
            else:
                write_exr(folder / f"Shot.{name}.{i:04d}.exr", chans)
    write_camera(folder, [_c2w(i) for i in range(N)])
    return folder


@pytest.mark.parametrize("per_pass_folders", [False, True], ids=["file-names", "pass-folders"])
def test_unreal_mrq_reads_to_canonical(tmp_path, caplog, per_pass_folders):
    d = write_unreal(tmp_path / "ue", per_pass_folders)
    with caplog.at_level(logging.INFO):
        stream = open_gbuffers(d)
    assert "conventions auto: unreal" in caplog.text
    frames = list(stream)
    check_frames(frames)
    assert "rgb" in frames[0].extras
    assert "alpha" not in caplog.text  # an all-1 alpha is no warning


def test_unreal_unsigned_normals_and_hand_axes(tmp_path):
    d = write_unreal(tmp_path / "ue01", unsigned_normals=True)  # n * 0.5 + 0.5 encoded: decoded by range
    check_frames(list(open_gbuffers(d, conventions="unreal")))
    # an Unreal camera at identity looks along +X: a wall facing it (-X) faces the viewer, +Z is up, +Y right
    conv = cv.CONVENTIONS["unreal"]
    cam = cv.Camera([np.eye(3)], "unreal", None, "test")
    n = np.array([[[-1.0, 0, 0], [0, 0, 1], [0, 1, 0]]])
    np.testing.assert_allclose(cv.to_camera_normals(n, conv, cam, 0, "t", "error")[0],
                               [[0, 0, 1], [0, 1, 0], [1, 0, 0]], atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Unity HDRP AOV Recorder: one sequence per AOV, smoothness instead of roughness, Y up left-handed.


def write_unity(folder):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(N):
        t = truth(i)
        depth = np.where(np.isfinite(t["depth"]), t["depth"], np.inf)
        n = world_normals(t["normal"], _c2w(i), "unity")
        rgb = lambda x: {"R": x[..., 0], "G": x[..., 1], "B": x[..., 2]}  # noqa: E731
        for name, chans in {"Albedo": rgb(t["albedo"]), "Depth": {"R": depth}, "Normal": rgb(n),
                            "Metal": {"R": t["metallic"]}, "Smoothness": {"R": 1 - t["roughness"]}}.items():
            write_exr(folder / f"AOV_{name}_{i:04d}.exr", chans)
    write_camera(folder, [_c2w(i) for i in range(N)])
    return folder


def test_unity_hdrp_aovs_read_to_canonical(tmp_path, caplog):
    d = write_unity(tmp_path / "unity")
    with caplog.at_level(logging.INFO):
        frames = list(open_gbuffers(d))
    assert "conventions auto: unity" in caplog.text
    check_frames(frames)
    for i, f in enumerate(frames):
        np.testing.assert_allclose(f.roughness, truth(i)["roughness"], atol=1e-6)  # 1 - smoothness
    conv = cv.CONVENTIONS["unity"]  # identity Unity camera looks +Z: a wall facing it is -Z
    cam = cv.Camera([np.eye(3)], "unity", None, "test")
    got = cv.to_camera_normals(np.array([[[0, 0, -1.0], [0, 1.0, 0]]]), conv, cam, 0, "t", "error")
    np.testing.assert_allclose(got[0], [[0, 0, 1], [0, 1, 0]], atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Our own form, and the checks that catch a wrong convention.


def write_alaya(folder, edit=None):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(N):
        t = truth(i)
        if edit:
            edit(t, i)
        chans = {f"albedo.{c}": t["albedo"][..., k] for k, c in enumerate("RGB")}
        chans.update({"depth.Z": t["depth"], "metallic.Y": t["metallic"], "roughness.Y": t["roughness"]})
        chans.update({f"normal.{c}": t["normal"][..., k] for k, c in enumerate("XYZ")})
        write_exr(folder / f"{i:06d}.exr", chans)
    return folder


def test_alaya_is_detected_and_untouched(tmp_path, caplog):
    d = write_alaya(tmp_path / "al")
    with caplog.at_level(logging.INFO):
        frames = list(open_gbuffers(d))
    assert "conventions auto: alaya" in caplog.text
    check_frames(frames)
    assert "WARNING" not in caplog.text


@pytest.mark.parametrize("edit, expected", [
    (lambda t, i: t.__setitem__("normal", world_normals(t["normal"], _rot("x", 160), "opengl")),
     "face away from the camera"),
    (lambda t, i: t.__setitem__("depth", np.where(np.isfinite(t["depth"]), t["depth"], 1e10)),
     "values >= 1e9"),
    (lambda t, i: t.__setitem__("depth", np.where(np.isfinite(t["depth"]), 0.98 + t["depth"] / 500, 1.0)),
     "looks like NDC, reverse-Z or normalised depth"),
    (lambda t, i: t["depth"].__setitem__((slice(5, 7), slice(None)), 0.0), "depth is 0 at 32 pixels"),
], ids=["world-normals", "1e10-background", "ndc-depth", "zero-depth"])
def test_wrong_convention_warns(tmp_path, caplog, edit, expected):
    d = write_alaya(tmp_path / "w", edit)
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(d))
    assert expected in caplog.text
    assert caplog.text.count(expected) == 1  # once per stream, not per frame


def test_albedo_alpha_warns(tmp_path, caplog):
    d = tmp_path / "alpha"
    d.mkdir()
    for i in range(N):
        t = truth(i)
        write_exr(d / f"albedo_{i:04d}.exr", {**{c: t["albedo"][..., k] * 0.5 for k, c in enumerate("RGB")},
                                              "A": np.full((H, W), 0.5)})
        write_exr(d / f"depth_{i:04d}.exr", {"Z": t["depth"]})
        write_exr(d / f"normal_{i:04d}.exr", {c: t["normal"][..., k] for k, c in enumerate("XYZ")})
        write_exr(d / f"metallic_{i:04d}.exr", {"Y": t["metallic"]})
        write_exr(d / f"roughness_{i:04d}.exr", {"Y": t["roughness"]})
    with caplog.at_level(logging.WARNING):
        check_frames(list(open_gbuffers(d)))
    assert "albedo alpha (A) is below 1 on 100% of pixels" in caplog.text  # and divided out (check_frames)


def test_explicit_convention_on_8bit_is_refused(tmp_path):
    from alaya_flash.streaming.files.sinks import PngSequenceSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    with PngSequenceSink(tmp_path / "png") as sink:
        write_stream(synthetic_stream(16, 16, 2), sink)
    with pytest.raises(AlayaError, match="blender conventions apply to float EXR passes"):
        open_gbuffers(tmp_path / "png", conventions="blender")
    assert open_gbuffers(tmp_path / "png").source.convention.name == "alaya"


def test_depth_range_auto_and_far(tmp_path, caplog):
    d = write_alaya(tmp_path / "dr")
    with caplog.at_level(logging.INFO):
        stream = open_gbuffers(d, depth_near="auto")
    fg = np.concatenate([truth(i)["depth"][np.isfinite(truth(i)["depth"])] for i in (0, 1, 2)])
    assert fg.min() <= stream.info.depth_near <= np.percentile(fg, 5)
    assert "depth_near auto" in caplog.text
    teacher = next(iter(stream.teacher_frames()))
    assert teacher[1].max() >= 250  # the near end of the 8-bit range is used
    f = next(iter(open_gbuffers(d, depth_far=3.0)))
    assert np.isposinf(f.depth[truth(0)["depth"] > 3.0]).all()
    assert cv.parse_depth_range("auto:200") == ("auto", 200.0)
    assert cv.parse_depth_range("0.25") == (0.25, None)
    for bad in ("near", "-1", "2:1", "0.5:x"):
        with pytest.raises(AlayaError, match="depth range"):
            cv.parse_depth_range(bad)


def test_cli_conventions_and_depth_range(tmp_path, capsys):
    from alaya_flash.streaming.cli import main

    d = write_blender(tmp_path / "bl")
    assert main(["--quiet", "gbuffers", "info", str(d), "--conventions", "blender"]) == 0
    assert "blender conventions" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["--quiet", "gbuffers", "convert", str(d), str(out), "--to", "exr", "--depth-range", "auto:4"]) == 0
    frames = list(open_gbuffers(out))
    check = truth(0)["depth"]
    assert np.isposinf(frames[0].depth[~(check <= 4)]).all()
    np.testing.assert_allclose(frames[0].normal[check <= 4], truth(0)["normal"][check <= 4], atol=1e-5)
    (d / "camera.json").unlink()
    assert main(["--quiet", "gbuffers", "info", str(d), "--scan", "0"]) == 2
    assert "write camera.json" in capsys.readouterr().err
    assert main(["--quiet", "gbuffers", "info", str(d), "--scan", "0", "--world-normals", "keep"]) == 0


def test_load_gbuffers_node_conventions_and_depth_range(tmp_path):
    from alaya_flash.nodes.gbuffers import LoadGBuffers

    d = write_unreal(tmp_path / "ue")
    assert LoadGBuffers.VALIDATE_INPUTS(str(d)) is True  # the path only: ComfyUI names each input it takes
    node = LoadGBuffers()
    with pytest.raises(AlayaError, match=r"^Load G-Buffers: depth range '3:1': FAR must be"):
        node._stream(str(d), "auto", 0, 0, 1, "stretch", 0, 0, depth_range="3:1")
    stream = node._stream(str(d), "auto", 0, 0, 1, "stretch", 0, 0, conventions="unreal", depth_range="auto:4")
    assert stream.source.convention.name == "unreal" and stream.info.depth_near < 1.1
    f = next(iter(stream))
    assert np.isposinf(f.depth[~(truth(0)["depth"] <= 4)]).all()
    chunks = list(node.open_stream(str(d), "auto", 0, 0, 1, "stretch", 0, 0, 16, conventions="unreal"))
    assert chunks[0][1] == N


def test_render_passes_conventions_and_depth_range_to_load_gbuffers(tmp_path, monkeypatch):
    """render --conventions/--depth-range set Load G-Buffers' widgets (the run itself is tested elsewhere)."""
    from alaya_flash.streaming.cli import main
    from alaya_flash.streaming.cli.commands import run as run_cmd

    seen = {}

    def fake_execute(wf, classes, quiet, label, **_):
        seen.update(next(n for n in wf.to_api().values() if n["class_type"] == "AlayaFlash_LoadGBuffers")["inputs"])
        raise SystemExit(0)

    monkeypatch.setattr(run_cmd, "execute", fake_execute)
    with pytest.raises(SystemExit):
        main(["--quiet", "render", str(write_alaya(tmp_path / "al")), "--prompt", "x", "--out", str(tmp_path / "o.mp4"),
              "--conventions", "alaya", "--depth-range", "auto:40"])
    assert seen["conventions"] == "alaya" and seen["depth_range"] == "auto:40"


def test_blender5_file_output_node_names(tmp_path, caplog):
    """Blender 5.0.1's compositor File Output node (checked with the bpy wheel) writes one RGBA EXR per
    item as `<file name><item><frame>.exr`, the file name field defaulting to `file_name`:
    `file_namealbedo0001.exr`; a float item (depth) is written as R = G = B, A = 1."""
    d = tmp_path / "fo5"
    d.mkdir()
    one = np.ones((H, W))
    for i in range(N):
        t = truth(i)
        depth = np.where(np.isfinite(t["depth"]), t["depth"], 1e10)
        n = world_normals(t["normal"], _c2w(i), "opengl")
        rgba = lambda x: {"R": x[..., 0], "G": x[..., 1], "B": x[..., 2], "A": one}  # noqa: E731
        gray = lambda x: {"R": x, "G": x, "B": x, "A": one}  # noqa: E731
        for item, chans in {"albedo": rgba(t["albedo"]), "depth": gray(depth), "normal": rgba(n),
                            "metallic": gray(t["metallic"]), "roughness": gray(t["roughness"])}.items():
            write_exr(d / f"file_name{item}{i + 1:04d}.exr", chans)
    write_camera(d, [_c2w(i) for i in range(N)])
    with caplog.at_level(logging.INFO):
        frames = list(open_gbuffers(d))
    assert "conventions auto: blender" in caplog.text
    check_frames(frames)


def test_unreal_multipart_one_file_per_frame(tmp_path, caplog):
    """MRQ's EXR with multilayer + multipart on: one part per render pass, bare R/G/B/A channels, named by part."""
    d = tmp_path / "uemp"
    d.mkdir()
    for i in range(N):
        t = truth(i)
        depth = np.where(np.isfinite(t["depth"]), t["depth"] * 100.0, 65504.0)
        n = world_normals(t["normal"], _c2w(i), "unreal")
        one = np.ones((H, W))
        rgba = lambda x: {"R": x[..., 0], "G": x[..., 1], "B": x[..., 2], "A": one}  # noqa: E731
        gray = lambda x: {"R": x, "G": x, "B": x, "A": one}  # noqa: E731
        write_exr_parts(d / f"Shot.{i:04d}.exr", {"FinalImage": rgba(t["albedo"]), "BaseColor": rgba(t["albedo"]),
                                                  "SceneDepth": gray(depth), "WorldNormal": rgba(n),
                                                  "Metallic": gray(t["metallic"]), "Roughness": gray(t["roughness"])})
    write_camera(d, [_c2w(i) for i in range(N)])
    assert "SceneDepth.R" in read_exr(d / "Shot.0000.exr")
    with caplog.at_level(logging.INFO):
        frames = list(open_gbuffers(d))
    assert "conventions auto: unreal" in caplog.text
    check_frames(frames)
    assert "rgb" in frames[0].extras


def test_blender_file_output_multilayer_named_like_ours_is_detected_by_header(tmp_path, caplog):
    """Blender 5's File Output node in multilayer mode names layers after its items: `albedo.R`, `depth.V`,
    `normal.R/G/B/A`, just like our own EXRs; the header's Software attribute ('Blender 5.0.1', as
    Blender 5.0.1 writes it) says who wrote them, so the world-space normals are not taken as ours."""
    import OpenEXR

    d = tmp_path / "foml"
    d.mkdir()
    one = np.ones((H, W))
    for i in range(N):
        t = truth(i)
        n = world_normals(t["normal"], _c2w(i), "opengl")
        chans = {**{f"albedo.{c}": t["albedo"][..., k] for k, c in enumerate("RGB")}, "albedo.A": one,
                 "depth.V": np.where(np.isfinite(t["depth"]), t["depth"], 1e10),
                 **{f"normal.{c}": n[..., k] for k, c in enumerate("RGB")}, "normal.A": one,
                 "metallic.V": t["metallic"], "roughness.V": t["roughness"]}
        header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage, "Software": "Blender 5.0.1"}
        OpenEXR.File(header, {k: np.ascontiguousarray(v, np.float32) for k, v in chans.items()}).write(
            str(d / f"file_name{i + 1:04d}.exr"))
    write_camera(d, [_c2w(i) for i in range(N)])
    with caplog.at_level(logging.INFO):
        frames = list(open_gbuffers(d))
    assert "conventions auto: blender" in caplog.text
    check_frames(frames)
