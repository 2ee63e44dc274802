"""`alaya-flash batch` on a real local Ray (127.0.0.1, 2 worker processes): one worker killed mid-shot,
the batch still finishes with every output complete and equal to the single-process render; a rerun
renders nothing; a changed prompt renders only its shots again. The manifest, fingerprints and
retries themselves: test_batch.py."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from batch_helpers import (CLI, RENDER, ROOT, TINY, batch, holding_worker, leftovers, make_clips, manifest,
                           output_bytes, write_list)
from process_helpers import store_prompts

ray = pytest.importorskip("ray", reason="Ray is not installed (the `ray` extra; `make test` installs it)")


@pytest.fixture(scope="module")
def cluster():
    """A private Ray on 127.0.0.1 with 2 CPUs, as `batch` starts one; the batches below join it."""
    from alaya_flash.streaming.render.ray_pool import start_local

    local = start_local(2)
    yield
    local.stop()


def _kill_when_held(mark, killed: list) -> threading.Thread:
    """Kill (SIGKILL) the worker that batch_helpers.holding_worker holds mid-shot, once it says so."""
    def watch():
        for _ in range(1200):  # a liveness bound, not a timing
            if mark.exists() and mark.read_text():
                pid = int(mark.read_text())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_worker_killed_mid_shot_then_rerun_then_a_changed_prompt(cluster, tmp_path, monkeypatch, capsys):
    from alaya_flash.streaming.cli import shots as shots_module

    clips = make_clips(tmp_path / "clips", 6)
    shots = [{"input": str(c), "prompt": f"street {i}"} for i, c in enumerate(clips)]
    listing = write_list(tmp_path / "shots.jsonl", shots)
    ref = tmp_path / "single"
    code, s = batch("--inputs", str(listing), "--out", f"{ref}/{{name}}.mp4", "--engine", "local", capsys=capsys)
    assert code == 0 and s["rendered"] == 6

    mark = tmp_path / "held"
    monkeypatch.setattr(shots_module, "ShotWorker", holding_worker("c2", mark))
    killed: list = []
    watcher = _kill_when_held(mark, killed)
    out = tmp_path / "out"
    code, s = batch("--inputs", str(listing), "--out", f"{out}/{{name}}.mp4", "--workers", "2", capsys=capsys)
    watcher.join(timeout=1)
    assert killed, "the held worker was never seen"
    assert code == 0 and (s["rendered"], s["failed"], s["workers"]) == (6, [], 2)
    records = manifest(out / "manifest.jsonl")
    assert records["c2"]["attempts"] == 2 and all(records[f"c{i}"]["attempts"] == 1 for i in (0, 1, 3, 4, 5))
    assert {r["status"] for r in records.values()} == {"done"}
    assert len({r["worker"] for r in records.values()}) == 2  # both workers rendered
    for c in clips:
        assert output_bytes(out / f"{c.name}.mp4") == output_bytes(ref / f"{c.name}.mp4"), c.name
    assert not leftovers(out)  # the killed worker's temporary output was swept by the retry
    assert {n: r["fingerprint"] for n, r in records.items()} == {n: r["fingerprint"] for n, r in manifest(ref / "manifest.jsonl").items()}

    stamps = {c.name: (out / f"{c.name}.mp4").stat().st_mtime_ns for c in clips}
    code, s = batch("--inputs", str(listing), "--out", f"{out}/{{name}}.mp4", "--workers", "2", capsys=capsys)
    assert code == 0 and (s["rendered"], s["skipped"], s["workers"]) == (0, 6, 0)  # no worker even started

    shots[1]["prompt"] = shots[4]["prompt"] = "a rainy night"
    write_list(listing, shots)
    store_prompts("a rainy night")  # the worker reads it back (the shots' other prompts: stored by the batches above)
    # one worker renders both (each worker's start is a process importing torch and loading MiniLM)
    code, s = batch("--inputs", str(listing), "--out", f"{out}/{{name}}.mp4", "--workers", "1", capsys=capsys)
    assert code == 0 and (s["rendered"], s["skipped"], s["workers"]) == (2, 4, 1)
    changed = {n for n, t in stamps.items() if (out / f"{n}.mp4").stat().st_mtime_ns != t}
    assert changed == {"c1", "c4"}
    after = manifest(out / "manifest.jsonl")
    assert {n for n in after if after[n]["fingerprint"] != records[n]["fingerprint"]} == {"c1", "c4"}


@pytest.mark.slow
def test_batch_starts_and_stops_its_own_local_ray(tmp_path):
    """Without Ray running, the command starts a private one (127.0.0.1) and stops it; its renders
    equal this process's."""
    clips = make_clips(tmp_path / "clips", 2)
    out = tmp_path / "out"
    store_prompts(json.loads(RENDER.read_text())["3"]["inputs"]["text"])  # the workflow's prompt: its worker reads it back
    env = dict(os.environ, OMP_NUM_THREADS="2")
    proc = subprocess.run([*CLI, "--quiet", "batch", str(RENDER), *TINY, "--inputs", f"{tmp_path}/clips/*",
                           "--out", f"{out}/{{name}}.mp4", "--engine", "ray", "--workers", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    code, _ = batch("--inputs", f"{tmp_path}/clips/*", "--out", f"{tmp_path}/single/{{name}}.mp4", "--engine", "local")
    assert code == 0
    for c in clips:
        assert output_bytes(out / f"{c.name}.mp4") == output_bytes(tmp_path / "single" / f"{c.name}.mp4")
    assert manifest(out / "manifest.jsonl")["c0"]["worker"] == "w1"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc")
def test_a_killed_batch_leaves_no_ray_process_behind():
    """`kill -9` of the process that started a private Ray (batch's start_local, with a task run on a
    worker): within 20 s none of that Ray's processes runs. Without the reaper the raylet's agents
    (ray::DashboardAgent, ray::RuntimeEnvAgent) stay for a minute or more, waiting on the dead GCS."""
    from alaya_flash.streaming.render import ray_reaper

    code = ("import sys, time; sys.path.insert(0, 'tests'); import conftest, ray; "
            "from alaya_flash.streaming.render.ray_pool import start_local; local = start_local(1); "
            "ray.get(ray.remote(lambda: 1).remote()); print(local.marker, flush=True); time.sleep(600)")
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        marker = driver.stdout.readline().strip()
        assert marker.startswith(f"{driver.pid}-"), marker
        def names() -> dict[int, str]:
            out = {}
            for pid in ray_reaper.marked(marker):
                try:
                    out[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
                except OSError:  # (ended between the two reads)
                    pass
            return out

        def agents_up(seen: dict[int, str]) -> bool:
            # the runtime-env agent: `ray::RuntimeEnvAgent` once it renames itself (setproctitle), its
            # script's path before that or without it
            return (any("raylet" in n for n in seen.values())
                    and any("RuntimeEnvAgent" in n or "runtime_env/agent" in n for n in seen.values()))

        for _ in range(600):  # the agents start a moment after the task ran (a busy machine: seconds)
            seen = names()
            if agents_up(seen):
                break
            time.sleep(0.1)
        assert agents_up(seen), seen
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 20
    while ray_reaper.marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = ray_reaper.marked(marker)
    ray_reaper.stop(left)  # (a failing run leaves nothing either)
    assert not left, f"still running after the batch process was killed: {sorted(left)}"
