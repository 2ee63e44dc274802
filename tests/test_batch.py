"""`alaya-flash batch` without Ray (in this process): manifest, resume by fingerprint, retries, a bad
shot among good ones, output-name collisions, and the same bits for the same shot in this process,
in another process, and whatever thread count the environment gives. The Ray pool: test_batch_ray.py."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from batch_helpers import CLI, RENDER, ROOT, TINY, batch, leftovers, make_clips, manifest, output_bytes, write_list

LOCAL = ["--engine", "local"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return make_clips(tmp_path_factory.mktemp("clips"), 3)


@pytest.mark.slow
def test_resume_renders_only_what_changed(clips, tmp_path, capsys):
    shots = write_list(tmp_path / "shots.jsonl", [{"input": str(c), "prompt": f"street {i}"} for i, c in enumerate(clips)])
    out = tmp_path / "out"
    code, s = batch("--inputs", str(shots), "--out", f"{out}/{{name}}.mp4", *LOCAL, capsys=capsys)
    assert code == 0 and (s["rendered"], s["skipped"], s["failed"]) == (3, 0, [])
    records = manifest(out / "manifest.jsonl")
    first = records["c0"]
    assert first["status"] == "done" and first["frames"] == 12 and first["attempts"] == 1 and first["error"] is None
    assert first["input"] == str(clips[0]) and first["outputs"] == [str(out / "c0.mp4")]
    assert set(first["seconds"]) == {"render", "setup", "wall"} and len(first["fingerprint"]) == 32
    assert first["bytes"] == {str(out / "c0.mp4"): (out / "c0.mp4").stat().st_size}
    assert len({r["fingerprint"] for r in records.values()}) == 3
    stamps = {n: (out / f"{n}.mp4").stat().st_mtime_ns for n in records}

    code, s = batch("--inputs", str(shots), "--out", f"{out}/{{name}}.mp4", *LOCAL, capsys=capsys)
    assert code == 0 and (s["rendered"], s["skipped"]) == (0, 3)

    # a changed prompt, changed input content, and a deleted output: exactly those shots again
    write_list(shots, [{"input": str(c), "prompt": "a rainy night" if i == 1 else f"street {i}"} for i, c in enumerate(clips)])
    code, s = batch("--inputs", str(shots), "--out", f"{out}/{{name}}.mp4", *LOCAL, capsys=capsys)
    assert code == 0 and (s["rendered"], s["skipped"]) == (1, 2)
    after = manifest(out / "manifest.jsonl")
    assert after["c1"]["fingerprint"] != records["c1"]["fingerprint"]
    assert [after[n]["fingerprint"] for n in ("c0", "c2")] == [records[n]["fingerprint"] for n in ("c0", "c2")]
    assert (out / "c0.mp4").stat().st_mtime_ns == stamps["c0"] and (out / "c2.mp4").stat().st_mtime_ns == stamps["c2"]

    moved = tmp_path / "c2-copy"
    shutil.copytree(clips[2], moved)
    window = next(moved.glob("*.npy"))
    data = np.load(window)
    data[0, 0, 0, 0, 0] ^= 1  # one bit of one G-buffer pixel
    np.save(window, data)
    (out / "c0.mp4").unlink()
    write_list(shots, [{"input": str(clips[0]), "prompt": "street 0"}, {"input": str(clips[1]), "prompt": "a rainy night"},
                       {"input": str(moved), "name": "c2", "prompt": "street 2"}])
    code, s = batch("--inputs", str(shots), "--out", f"{out}/{{name}}.mp4", *LOCAL, capsys=capsys)
    assert code == 0 and (s["rendered"], s["skipped"]) == (2, 1)
    assert manifest(out / "manifest.jsonl")["c2"]["input"] == str(moved)
    assert not leftovers(tmp_path)


def test_a_bad_shot_is_retried_listed_and_the_batch_goes_on(clips, tmp_path, capsys):
    inputs = tmp_path / "in"
    for c in clips[:2]:
        shutil.copytree(c, inputs / c.name)
    shutil.copytree(clips[0], inputs / "bad")
    (next((inputs / "bad").glob("*.npy"))).write_bytes(b"not an npy file")
    out = tmp_path / "out"
    code, s = batch("--inputs", f"{inputs}/*", "--out", f"{out}/{{name}}.mp4", "--retries", "1", *LOCAL, capsys=capsys)
    assert code == 1
    assert (s["rendered"], len(s["failed"])) == (2, 1)
    (failed,) = s["failed"]
    assert failed["name"] == "bad" and failed["attempts"] == 2 and "not a readable .npy file" in failed["error"]
    assert (out / "c0.mp4").is_file() and (out / "c1.mp4").is_file() and not (out / "bad.mp4").exists()
    record = manifest(out / "manifest.jsonl")["bad"]
    assert record["status"] == "failed" and "window-0000.npy" in record["error"]
    assert not leftovers(tmp_path)
    # the rerun tries the failed shot again and skips the finished ones
    code, s = batch("--inputs", f"{inputs}/*", "--out", f"{out}/{{name}}.mp4", "--retries", "0", *LOCAL, capsys=capsys)
    assert code == 1 and (s["rendered"], s["skipped"], len(s["failed"])) == (0, 2, 1)


def test_inputs_writing_the_same_output_are_refused_before_anything_runs(clips, tmp_path, capsys):
    inputs = tmp_path / "in"
    shutil.copytree(clips[0], inputs / "c1")
    shutil.copy(next(clips[1].glob("*.npy")), inputs / "c1.npy")  # a file named c1 too: {name} = c1 for both
    out = tmp_path / "out"
    code, _ = batch("--inputs", f"{inputs}/*", "--out", f"{out}/{{name}}.mp4", *LOCAL)
    err = capsys.readouterr().err
    assert code == 2 and "c1'" in err and "c1.npy'" in err and "c1.mp4" in err
    assert not out.exists()
    from alaya_flash.streaming.cli import main

    code = main(["run", str(RENDER), *TINY, "--inputs", f"{inputs}/*", "--set", f"Save.filename={out}/{{name}}.mp4"])
    assert code == 2 and "would all write" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("entry, message", [
    ({"input": "c0", "promt": "x"}, "unknown key 'promt'"),
    ({"input": "c0", "seed": "7"}, "'seed' must be an integer"),
    ({"input": "c0", "seed": -1}, "'seed' -1 is out of range [0, 9223372036854775807]"),  # was argparse's error, from inside
    ({"input": "c0", "seed": 2**64}, "'seed' 18446744073709551616 is out of range"),
    ({"name": "x"}, "an 'input' path"),
    # a NUL in a path reached os.path.realpath as a ValueError (a traceback)
    ({"input": "c0\x00"}, "input 'c0\\x00' holds a NUL character"),
    ({"input": "c0", "name": "a\x00b"}, "name 'a\\x00b' holds a NUL character"),
    ({"input": "c0", "set": ["Save.filename=x\x00y"]}, "x\\x00y.mp4' holds a NUL character"),
])
def test_bad_input_list_entries_are_one_line_naming_the_line(clips, tmp_path, capsys, entry, message):
    shots = write_list(tmp_path / "shots.jsonl", [{"input": str(clips[0])}, entry])
    code, _ = batch("--inputs", str(shots), "--out", f"{tmp_path}/o/{{name}}.mp4", *LOCAL)
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"{shots}:2:" in err and message in err and len(err.splitlines()) == 1


def test_an_input_list_nested_too_deeply_is_one_line(tmp_path, capsys):
    """JSON nested past Python's recursion limit was a RecursionError (a traceback), not "not JSON"."""
    for name, text in (("shots.jsonl", '{"input": ' + "[" * 5000 + "]" * 5000 + "}\n"),
                       ("shots.json", "[" * 5000 + "]" * 5000)):
        (tmp_path / name).write_text(text)
        code, _ = batch("--inputs", str(tmp_path / name), "--out", f"{tmp_path}/o/{{name}}.mp4", *LOCAL)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"{name}" in err and "not JSON (nested too deeply" in err


@pytest.mark.slow
def test_same_shot_same_bits_in_this_process_and_another_whatever_its_default_threads(clips, tmp_path, capsys):
    """The shot's frames do not depend on the process, on what it rendered before, or on the thread
    count the environment gives (the worker sets its own). Float32 EXR frames show every bit: in a
    process started with OMP_NUM_THREADS=2 the tiny model's frames differ in their last bits unless
    the worker sets its thread count (checked by removing ShotWorker's torch.set_num_threads)."""
    threads = torch.get_num_threads()
    args = ["--inputs", str(clips[2]), "--set", "Save.format=exr", "--set", "3.text=0: a street\n4: a long rainy night road"]
    code, _ = batch(*args, "--out", f"{tmp_path}/a/{{name}}", *LOCAL, capsys=capsys)
    assert code == 0
    write_list(tmp_path / "other.jsonl", [{"input": str(clips[0]), "prompt": "a street"}])
    assert batch("--inputs", str(tmp_path / "other.jsonl"), "--out", f"{tmp_path}/x/{{name}}", *LOCAL, capsys=capsys)[0] == 0
    code, _ = batch(*args, "--out", f"{tmp_path}/b/{{name}}", *LOCAL, capsys=capsys)  # after another shot in this process
    assert code == 0
    # no prompt store: the other process encodes the prompts itself rather than reading this one's
    env = dict(os.environ, OMP_NUM_THREADS="2", ALAYA_FLASH_PROMPT_STORE="off")
    proc = subprocess.run([*CLI, "--quiet", "batch", str(RENDER), *TINY, *args, "--out", f"{tmp_path}/c/{{name}}", *LOCAL],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    a, b, c = (output_bytes(tmp_path / d / "c2") for d in "abc")
    assert len(a) == 12
    assert a == b and a == c
    fingerprints = {manifest(tmp_path / d / "manifest.jsonl")["c2"]["fingerprint"] for d in "abc"}
    assert len(fingerprints) == 1
    # the thread count is part of the fingerprint: a batch with another one renders again
    code, s = batch(*args, "--out", f"{tmp_path}/d/{{name}}", "--threads", "2", *LOCAL, capsys=capsys)
    assert code == 0 and s["rendered"] == 1
    assert manifest(tmp_path / "d" / "manifest.jsonl")["c2"]["fingerprint"] not in fingerprints
    assert torch.get_num_threads() == threads  # an in-process batch gives its caller's thread count back


def test_a_prompt_embeds_the_same_alone_or_beside_others():
    """The prompt cache keeps what the first encoding gave; padded beside a longer prompt the floats
    differed in their last bits, so a shot's frames depended on which prompts came before it."""
    from alaya_flash.model_zoo.text_encoder import TextEncoder

    base = TextEncoder.load()
    alone = TextEncoder(base.model, base.tokenizer)(["a sunny street"])[0]
    beside = TextEncoder(base.model, base.tokenizer)(["a rainy night over a long and winding road", "a sunny street"])[1]
    assert torch.equal(alone, beside)


def test_no_ray_needed_and_ray_imported_only_by_the_pool():
    """The batch command and the engine import without Ray; only ray_pool's functions import it."""
    code = ("import sys; sys.path.insert(0, 'tests'); import conftest; from alaya_flash.streaming.cli import main; from alaya_flash.streaming.render import batch, ray_pool; "
            "from alaya_flash.streaming.cli.commands import batch as b; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_help_lists_batch(capsys):
    from alaya_flash.streaming.cli import main

    with pytest.raises(SystemExit):
        main(["batch", "--help"])
    assert "--inputs GLOB|LIST" in capsys.readouterr().out


def test_a_split_shot_is_its_parts_pre_roll_dropped_joined_in_order(clips, tmp_path, capsys):
    """--split 5 --preroll 3 on 12 frames: parts read [0, 5), [2, 10), [7, 12) and keep [0, 5), [5, 10),
    [10, 12); the joined output equals those three ranges rendered as shots of their own, each with
    its pre-roll frames dropped."""
    png = ["--set", "Save.format=png"]
    code, s = batch("--inputs", str(clips[0]), "--out", f"{tmp_path}/split/{{name}}", "--split", "5", "--preroll", "3",
                    "--overlap", "0", *png, *LOCAL, capsys=capsys)
    assert code == 0 and s["frames"] == 12
    record = manifest(tmp_path / "split" / "manifest.jsonl")["c0"]
    assert record["frames"] == 12 and record["attempts"] == 1
    ranges = [(0, 5, 0), (2, 8, 3), (7, 5, 3)]  # (start, frames read, pre-roll dropped)
    write_list(tmp_path / "ranges.jsonl", [{"input": str(clips[0]), "name": f"r{i}", "set": [f"1.start={a}", f"1.frames={n}"]}
                                           for i, (a, n, _) in enumerate(ranges)])
    code, _ = batch("--inputs", str(tmp_path / "ranges.jsonl"), "--out", f"{tmp_path}/ranges/{{name}}", *png, *LOCAL,
                    capsys=capsys)
    assert code == 0
    joined = [f for i, (_, _, drop) in enumerate(ranges)
              for f in list(output_bytes(tmp_path / "ranges" / f"r{i}").values())[drop:]]
    assert list(output_bytes(tmp_path / "split" / "c0").values()) == joined
    assert not list((tmp_path / "split").glob(".*parts*")) and not leftovers(tmp_path)
    # the split settings are in the fingerprint; the same split again is complete
    code, s = batch("--inputs", str(clips[0]), "--out", f"{tmp_path}/split/{{name}}", "--split", "5", "--preroll", "3",
                    "--overlap", "0", *png, *LOCAL, capsys=capsys)
    assert code == 0 and s["skipped"] == 1
    code, s = batch("--inputs", str(clips[0]), "--out", f"{tmp_path}/split/{{name}}", *png, *LOCAL, capsys=capsys)
    assert code == 0 and s["rendered"] == 1


def test_split_parts_crossfade_the_frames_they_share(clips, tmp_path, capsys):
    """--split 5 --preroll 3 --overlap 2 on 12 frames: parts read [0, 5), [0, 10), [5, 12) and write
    [0, 5), [3, 10), [8, 12); the output is the first part's frames, then frames 3 and 4 blended
    with the second part's first two at weights 1/3 and 2/3, its frames 5..7, frames 8 and 9 blended
    likewise with the third part's, then its frames 10 and 11: each part equal to that range rendered
    as a shot of its own. The overlap is in the fingerprint."""
    from alaya_flash.streaming.files.image_files import read_png

    png = ["--set", "Save.format=png"]
    code, s = batch("--inputs", str(clips[0]), "--out", f"{tmp_path}/split/{{name}}", "--split", "5", "--preroll", "3",
                    "--overlap", "2", *png, *LOCAL, capsys=capsys)
    assert code == 0 and s["frames"] == 12
    ranges = [(0, 5, 0), (0, 10, 3), (5, 7, 3)]  # (start, frames read, pre-roll dropped)
    write_list(tmp_path / "ranges.jsonl", [{"input": str(clips[0]), "name": f"r{i}", "set": [f"1.start={a}", f"1.frames={n}"]}
                                           for i, (a, n, _) in enumerate(ranges)])
    code, _ = batch("--inputs", str(tmp_path / "ranges.jsonl"), "--out", f"{tmp_path}/ranges/{{name}}", *png, *LOCAL,
                    capsys=capsys)
    assert code == 0
    r = [[read_png(p).astype(np.float32) for p in sorted((tmp_path / "ranges" / f"r{i}").glob("*.png"))][drop:]
         for i, (_, _, drop) in enumerate(ranges)]

    def blend(a, b, w):
        return np.clip(np.round((1 - w) * a + w * b), 0, 255)

    want = [*r[0][:3], blend(r[0][3], r[1][0], 1 / 3), blend(r[0][4], r[1][1], 2 / 3), *r[1][2:5],
            blend(r[1][5], r[2][0], 1 / 3), blend(r[1][6], r[2][1], 2 / 3), *r[2][2:]]
    got = [read_png(p).astype(np.float32) for p in sorted((tmp_path / "split" / "c0").glob("*.png"))]
    assert len(got) == 12 and all(np.array_equal(g, w) for g, w in zip(got, want))
    assert not np.array_equal(got[8], r[1][5]) and not np.array_equal(got[8], r[2][0])  # streams from 0 and 5 differ
    code, s = batch("--inputs", str(clips[0]), "--out", f"{tmp_path}/split/{{name}}", "--split", "5", "--preroll", "3",
                    "--overlap", "1", *png, *LOCAL, capsys=capsys)
    assert code == 0 and s["rendered"] == 1
    code, _ = batch("--inputs", str(clips[0]), "--out", f"{tmp_path}/x/{{name}}", "--split", "5", "--overlap", "5",
                    *png, *LOCAL)
    err = capsys.readouterr().err
    assert code == 2 and "--overlap 5 must be below --split 5" in err and len(err.splitlines()) == 1


def test_without_ray_the_same_command_renders_here(clips, tmp_path, monkeypatch, capsys):
    from alaya_flash.streaming.render import ray_pool

    monkeypatch.setattr(ray_pool, "available", lambda: False)
    code, s = batch("--inputs", str(clips[1]), "--out", f"{tmp_path}/{{name}}.mp4", capsys=capsys)  # --engine auto
    assert code == 0 and (s["rendered"], s["workers"]) == (1, 1)
    assert manifest(tmp_path / "manifest.jsonl")["c1"]["status"] == "done"
    code, _ = batch("--inputs", str(clips[1]), "--out", f"{tmp_path}/{{name}}.mp4", "--address", "127.0.0.1:1")
    assert code == 2 and "--address needs Ray" in capsys.readouterr().err



@pytest.mark.slow
def test_four_shots_in_one_process_equal_four_single_shot_renders_byte_for_byte(tmp_path, capsys):
    """A shot's MP4 (the default output) does not depend on what the process rendered before: x264's
    macroblock tree read memory it never wrote, so every shot after the first, whose encoder got
    memory an earlier one had freed, came out different (and different from run to run). Before the
    fix 3 of these 4 shots differed. A physics-world clip and the default model: the tiny random
    model's flat frames and the synthetic clips left x264 nothing to decide. 8 frames: with the macroblock
    tree back on, a shot differed in each of 5 runs (4 frames: in none of 3)."""
    from alaya_flash.streaming.cli import main

    clip = tmp_path / "w"
    assert main(["--quiet", "world", "--out", str(clip), "--frames", "8", "--size", "64", "--seed", "1"]) == 0
    shots = [{"input": str(clip), "name": f"s{i}", "seed": i} for i in range(4)]
    args = ["--quiet", "batch", str(RENDER), "--engine", "local"]
    for run in ("a", "b"):  # twice: the second batch runs after four shots already rendered here
        write_list(tmp_path / "all.jsonl", shots)
        assert main([*args, "--inputs", str(tmp_path / "all.jsonl"), "--out", f"{tmp_path}/{run}/{{name}}.mp4"]) == 0
    for shot in shots:
        write_list(tmp_path / f"{shot['name']}.jsonl", [shot])
        assert main([*args, "--inputs", str(tmp_path / f"{shot['name']}.jsonl"),
                     "--out", f"{tmp_path}/one-{shot['name']}/{{name}}.mp4"]) == 0
    for shot in shots:
        alone = (tmp_path / f"one-{shot['name']}" / f"{shot['name']}.mp4").read_bytes()
        assert [(tmp_path / run / f"{shot['name']}.mp4").read_bytes() == alone for run in "ab"] == [True, True], shot


def test_a_second_batch_on_the_same_output_folder_is_refused_in_one_line(clips, tmp_path, capsys):
    """Two batches on one --out both rendered everything and raced on the manifest: the second is
    refused while the first holds the manifest's lock (the lock goes with its process)."""
    from alaya_flash.streaming.render.batch import ManifestLock

    out = tmp_path / "out"
    with ManifestLock(out / "manifest.jsonl"):
        code, _ = batch("--inputs", str(clips[0]), "--out", f"{out}/{{name}}.mp4", *LOCAL)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1
        assert f"{out / 'manifest.jsonl'}: another batch (pid {os.getpid()}) is rendering into this manifest" in err
        assert not (out / "c0.mp4").exists()
    code, s = batch("--inputs", str(clips[0]), "--out", f"{out}/{{name}}.mp4", *LOCAL, capsys=capsys)
    assert code == 0 and s["rendered"] == 1


def test_an_input_list_cannot_send_an_output_outside_out_unless_allowed(clips, tmp_path, capsys):
    """A list's `set Save.filename=...` wrote wherever it said (outside --out); refused by FILE:LINE."""
    elsewhere = tmp_path / "elsewhere"
    shots = write_list(tmp_path / "shots.jsonl", [{"input": str(clips[0])},
                                                  {"input": str(clips[1]), "set": [f"Save.filename={elsewhere}/x.mp4"]}])
    code, _ = batch("--inputs", str(shots), "--out", f"{tmp_path}/out/{{name}}.mp4", *LOCAL)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{shots}:2: its output {elsewhere / 'x.mp4'} is outside {tmp_path / 'out'}" in err and "--allow-outside" in err
    assert not elsewhere.exists() and not (tmp_path / "out" / "c0.mp4").exists()
    write_list(shots, [{"input": str(clips[0]), "set": [f"Save.filename={tmp_path}/out/../escaped.mp4"]}])
    assert batch("--inputs", str(shots), "--out", f"{tmp_path}/out/{{name}}.mp4", *LOCAL)[0] == 2
    write_list(shots, [{"input": str(clips[1]), "set": [f"Save.filename={elsewhere}/x.mp4"]}])
    code, s = batch("--inputs", str(shots), "--out", f"{tmp_path}/out/{{name}}.mp4", "--allow-outside", *LOCAL,
                    capsys=capsys)
    assert code == 0 and s["rendered"] == 1 and (elsewhere / "x.mp4").is_file()


def test_the_pool_is_sized_by_jobs_so_a_split_shots_parts_run_side_by_side(clips, tmp_path, monkeypatch, capsys):
    """--split ran every part on one worker: the pool was capped at the number of shots, not parts."""
    from alaya_flash.model_zoo.errors import AlayaError
    from alaya_flash.streaming.render import ray_pool

    asked = {}

    class Pool:
        def __init__(self, *args, **kwargs):
            asked.update(kwargs)
            raise AlayaError("stop here")

    monkeypatch.setattr(ray_pool, "available", lambda: True)
    monkeypatch.setattr(ray_pool, "RayPool", Pool)
    code, _ = batch("--inputs", str(clips[0]), "--out", f"{tmp_path}/{{name}}", "--split", "5", "--preroll", "0",
                    "--gpus-per-worker", "0", "--set", "Save.format=png")
    assert code == 2 and "stop here" in capsys.readouterr().err
    assert asked["most"] == 3  # 12 frames in parts of 5


def test_a_cluster_that_refuses_the_driver_is_one_line_with_the_token_hint(monkeypatch):
    pytest.importorskip("ray")
    import ray

    from alaya_flash.model_zoo.errors import AlayaError
    from alaya_flash.streaming.render import ray_pool

    def refuse(**_):
        raise ConnectionError("Failed to connect to GCS: UNAUTHENTICATED: invalid or missing token\nmore detail")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(AlayaError) as err:
        ray_pool.connect("head:6379")
    text = str(err.value)
    assert "\n" not in text and text.startswith("--address head:6379: could not join the Ray cluster (ConnectionError: "
                                                "Failed to connect to GCS: UNAUTHENTICATED")
    assert "RAY_AUTH_MODE=token" in text and "RAY_AUTH_TOKEN" in text


@pytest.mark.slow
def test_the_runtime_is_part_of_a_shots_fingerprint(clips, tmp_path, capsys, monkeypatch):
    """A shot rendered by OpenVINO is not the torch render's: the manifest tells them apart."""
    from alaya_flash.model_zoo import runtime

    if runtime.openvino_version() is None:
        pytest.skip("needs openvino (the openvino extra)")
    monkeypatch.setenv(runtime.ENV, "torch")  # restored afterwards: --backend openvino puts its choice there
    args = ["--inputs", str(clips[0]), "--set", "Save.format=png", "--set", "1.frames=5"]
    assert batch(*args, "--out", f"{tmp_path}/t/{{name}}", *LOCAL, capsys=capsys)[0] == 0
    code, s = batch(*args, "--out", f"{tmp_path}/o/{{name}}", "--backend", "openvino", *LOCAL, capsys=capsys)
    assert code == 0 and s["rendered"] == 1
    torch_print, openvino_print = (manifest(tmp_path / d / "manifest.jsonl")["c0"]["fingerprint"] for d in "to")
    assert torch_print != openvino_print
    runtime.configure(None)
