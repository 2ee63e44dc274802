"""Property-based bad input (hypothesis): whatever a reader, a command-line number or a workflow file
holds, the outcome is a clear one-line error (AlayaError / exit 2) or a valid result; never a
traceback, and nothing left behind. Example counts are bounded so the file runs in seconds."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.cli import UsageError, build_parser, main
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**12, 10**12)).map(str)
texts = st.one_of(numbers, st.text(max_size=12), st.sampled_from(["nan", "inf", "-inf", "1e309", "0x10", "", " 3"]))
FLAGS = {  # command line prefix -> its numeric flags
    ("render", "clip", "--prompt", "p", "--out", "o.mp4"): ["--fps", "--frames", "--seed", "--steps", "--size"],
    ("world", "--out", "w"): ["--fps", "--frames", "--seed", "--objects", "--window", "--fov", "--size"],
    ("gbuffers", "convert", "a", "b", "--to", "png"): ["--start", "--stop", "--stride", "--window", "--fps", "--size"],
    ("serve",): ["--port", "--fps", "--seed", "--steps", "--chunk-latents", "--size"],
    ("batch", "wf.json", "--inputs", "x"): ["--retries", "--workers", "--threads", "--gpus-per-worker", "--split", "--preroll"],
}


@FAST
@given(prefix=st.sampled_from(sorted(FLAGS)), data=st.data(), value=texts)
def test_numeric_flags_parse_to_a_finite_in_range_value_or_one_usage_line(prefix, data, value):
    flag = data.draw(st.sampled_from(FLAGS[prefix]))
    try:
        args = build_parser().parse_args([*prefix, flag, value])
    except UsageError as err:
        assert "\n" not in str(err) and flag in str(err)
        return
    got = getattr(args, flag.lstrip("-").replace("-", "_"))
    for v in got if isinstance(got, tuple) else (got,):
        assert isinstance(v, (int, float)) and math.isfinite(v)
        assert v >= 0 and (flag != "--fps" or v > 0)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20)


def _mutations():
    api = json.loads((ROOT / "workflows" / "api" / "render-gbuffer-sequence.json").read_text())
    nodes = sorted(api)
    return st.tuples(st.sampled_from(nodes), st.sampled_from(["drop", "set", "class", "link"]), json_values)


@FAST
@given(mutation=_mutations())
def test_a_mutated_workflow_validates_or_is_refused_by_name(mutation, tmp_path_factory, capsys):
    nid, how, value = mutation
    api = json.loads((ROOT / "workflows" / "api" / "render-gbuffer-sequence.json").read_text())
    inputs = api[nid]["inputs"]
    name = sorted(inputs)[len(str(value)) % len(inputs)] if inputs else "x"
    if how == "drop":
        inputs.pop(name, None)
    elif how == "set":
        inputs[name] = value
    elif how == "class":
        api[nid]["class_type"] = value if isinstance(value, str) else str(value)
    else:
        inputs[name] = [str(value)[:3], 0 if not isinstance(value, int) else value]
    path = tmp_path_factory.mktemp("wf") / "wf.json"
    path.write_text(json.dumps(api))
    assert main(["run", str(path), "--validate-only"]) in (0, 2)
    assert "Traceback" not in capsys.readouterr().err


@FAST
@given(doc=json_values)
def test_any_json_document_is_a_workflow_or_one_clear_refusal(doc, tmp_path_factory, capsys):
    path = tmp_path_factory.mktemp("wf") / "any.json"
    path.write_text(json.dumps(doc))
    assert main(["run", str(path), "--validate-only"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "Traceback" not in err


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """One small clip in each layout a reader knows."""
    root = tmp_path_factory.mktemp("clips")
    made = {}
    for name, sink in {"teacher-mp4": sinks.TeacherMp4Sink(root / "mp4", fps=16),
                       "image-sequence": sinks.PngSequenceSink(root / "png"),
                       "npy-windows": sinks.NpyWindowSink(root / "npy", window=4)}.items():
        with sink:
            for f in synthetic_stream(16, 16, 5):
                sink.write(gbuffer=f)
        made[name] = sink.path
    return made


@FAST
@given(layout=st.sampled_from(["teacher-mp4", "image-sequence", "npy-windows"]), pick=st.integers(0, 1000),
       cut=st.floats(0, 1), junk=st.binary(max_size=64))
def test_a_corrupted_file_reads_whole_or_is_refused_by_name(clips, layout, pick, cut, junk, tmp_path_factory):
    """Truncate one file of a clip at a random point and append random bytes: the reader either still
    reads every frame (some codecs tolerate a damaged tail) or names the problem in one AlayaError."""
    work = tmp_path_factory.mktemp("bad") / "clip"
    shutil.copytree(clips[layout], work)
    files = sorted(p for p in work.rglob("*") if p.is_file())
    victim = files[pick % len(files)]
    data = victim.read_bytes()
    victim.write_bytes(data[: int(len(data) * cut)] + junk)
    try:
        frames = list(open_gbuffers(work).teacher_frames())
    except AlayaError as err:
        assert "\n" not in str(err).strip()
        return
    assert all(f.shape == (5, 16, 16, 3) and f.dtype == np.uint8 for f in frames)


# ---- model config fields, camera.json, engine frames, batch input lists ----------------------

numbers_json = st.one_of(st.integers(-10**6, 10**7), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                         st.none(), st.text(max_size=4), st.lists(st.integers(-3, 300), max_size=4))


@pytest.fixture(scope="module")
def tiny_flash(tmp_path_factory):
    from alaya_flash.model_zoo import bundle

    folder = tmp_path_factory.mktemp("flash") / "m"
    bundle.save_flash(bundle.make_random_flash(), folder)
    return folder


def _config_keys():
    from alaya_flash.model_zoo import config_fields

    roles = {"dit": "dit", "gbuffer_encoder": "gbuffer-encoder", "decoder": "tiny-codec"}
    keys = [("networks", role, k) for role, family in roles.items() for k in config_fields.NETWORKS[family]]
    keys += [("networks", role, "config_name") for role in roles]  # beside each network's config
    return keys + [("session", k) for k in config_fields.SESSION["flash"]] + [(k,) for k in ("trained_size", *config_fields.MODEL)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(_config_keys()), value=numbers_json)
def test_any_value_in_any_model_config_field_loads_in_range_or_is_one_line(tiny_flash, key, value, tmp_path_factory):
    """Every field of config.json: the model loads with settings inside the table's ranges, or one
    CheckpointError names the file and the field (never a ZeroDivisionError, a hang or a NaN render)."""
    from alaya_flash.model_zoo import config_fields, folders

    folder = tmp_path_factory.mktemp("cfg") / "m"
    shutil.copytree(tiny_flash, folder)
    cfg = json.loads((folder / "config.json").read_text())
    if key[0] == "networks" and key[2] == "config_name":
        cfg["networks"][key[1]]["config_name"] = value
    elif key[0] == "networks":
        cfg["networks"][key[1]]["config"][key[2]] = value
    elif key[0] == "session":
        cfg["session"][key[1]] = value
    else:
        cfg[key[0]] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    try:
        model = folders.load_flash(folder)
    except AlayaError as err:
        assert "\n" not in str(err) and "config.json" in str(err) or ".safetensors" in str(err)
        return
    table = config_fields.SESSION["flash"]
    for name, field in table.items():
        assert field.problem(getattr(model.settings, name)) is None
    assert model.trained_size is None or all(8 <= s <= 4096 and s % 8 == 0 for s in model.trained_size)
    assert isinstance(cfg.get("random_weights", False), bool) and isinstance(cfg.get("notes", ""), str)  # loaded: valid
    assert isinstance(cfg["networks"][key[1]]["config_name"] if key[0] == "networks" else None, (str, type(None)))


camera_values = st.one_of(json_values, st.lists(st.lists(numbers_json, min_size=3, max_size=4), min_size=3, max_size=4),
                          st.lists(st.lists(st.floats(-2, 2), min_size=4, max_size=4), min_size=4, max_size=4))


@FAST
@given(doc=st.one_of(json_values, st.fixed_dictionaries(
    {"camera_to_world": camera_values},
    optional={"fov_y_deg": numbers_json, "camera_axes": st.one_of(st.sampled_from(["opengl", "unreal"]), json_values)})))
def test_any_camera_json_is_a_camera_or_one_line(doc, tmp_path_factory):
    from alaya_flash.streaming.files.conventions import load_camera

    path = tmp_path_factory.mktemp("cam") / "camera.json"
    path.write_text(json.dumps(doc))
    try:
        camera = load_camera(path, "opengl")
    except AlayaError as err:
        assert "\n" not in str(err) and str(path) in str(err)
        return
    for r in camera.rotations:
        assert r.shape == (3, 3) and np.isfinite(r).all() and abs(np.linalg.det(r)) > 0


special = st.sampled_from([0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e30, -1e-30])


@FAST
@given(name=st.sampled_from(["albedo", "depth", "metallic", "normal", "roughness"]), where=st.integers(0, 255),
       value=special, near=st.sampled_from([0.0, 0.5, 2.0]))
def test_an_engine_frame_of_float_passes_is_refused_in_one_line_or_encodes(name, where, value, near):
    from alaya_flash.streaming.gbuffer import GBufferFrame, frame_to_teacher
    from alaya_flash.streaming.live import wire

    passes = {"albedo": np.full((16, 16, 3), 0.5), "depth": np.full((16, 16), 3.0), "metallic": np.zeros((16, 16)),
              "normal": np.tile(np.float32([0, 0, 1]), (16, 16, 1)), "roughness": np.full((16, 16), 0.5)}
    passes[name] = passes[name].copy()
    passes[name][where // 16, where % 16] = value
    try:
        message = wire.pack_gbuffers(3, 0.0, passes, depth_near=near)
    except ValueError as err:
        assert "\n" not in str(err) and name in str(err)
        return
    m = wire.unpack_gbuffers(message)
    got = m.float_passes()
    assert wire.float_pass_problem(m.number, got) is None
    with np.errstate(all="raise"):  # no NaN or overflow reaches the encoding
        teacher = frame_to_teacher(GBufferFrame(index=3, timestamp=0.0, **got), near or 0.5)
    assert teacher.dtype == np.uint8 and teacher.shape == (5, 16, 16, 3)


list_entries = st.one_of(json_values, st.fixed_dictionaries(
    {"input": st.one_of(st.text(max_size=6), numbers_json)},
    optional={"name": st.one_of(st.text(max_size=6), numbers_json), "seed": numbers_json,
              "prompt": st.one_of(st.text(max_size=6), numbers_json), "set": st.one_of(json_values, st.lists(st.text(max_size=8)))}))


def test_a_batch_input_of_an_unknown_users_home_is_one_line(tmp_path):
    """'~0' (found by the property below): a user this machine does not have, one line naming the list's line."""
    from alaya_flash.streaming.cli.commands.batch import _read_list

    path = tmp_path / "shots.jsonl"
    path.write_text(json.dumps({"input": "~no-such-user-here/clip"}) + "\n")
    with pytest.raises(AlayaError, match=r"shots.jsonl:1: input '~no-such-user-here/clip': no home directory for '~no-such-user-here' \(no such user\)"):
        _read_list(path)


@FAST
@given(entries=st.lists(list_entries, min_size=1, max_size=3))
def test_any_batch_input_list_reads_or_is_one_line_naming_the_line(entries, tmp_path_factory):
    from alaya_flash.streaming.cli.commands.batch import _read_list

    path = tmp_path_factory.mktemp("list") / "shots.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    try:
        got = _read_list(path)
    except AlayaError as err:
        assert "\n" not in str(err) and str(path) in str(err)
        return
    for entry in got:
        assert isinstance(entry["input"], str) and entry["input"]
        assert "seed" not in entry or (isinstance(entry["seed"], int) and 0 <= entry["seed"] < 2**63)
        assert "name" not in entry or (entry["name"] and "/" not in entry["name"])
