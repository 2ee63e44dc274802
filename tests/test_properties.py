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
