"""`alaya-flash bench`: the figures it reports come from a real run of the render workflow.

No timing is asserted (speed is measured by the benchmark itself, never by tests): these check
that the report is whole and consistent, that bad options are refused by name, and on a GPU that
the GPU's figures are there.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from alaya_flash.streaming.cli import main

TINY = ["--dit", "dit-tiny", "--encoder", "gbuffer-encoder-slim", "--decoder", "taew-slim"]
STAGES = {"read", "encode", "sample", "decode", "write"}
FLASH_STAGES = STAGES | {"refine"}  # random weights come with a G-buffer refiner unless --refiner none


def bench(capsys, *args) -> dict:
    assert main(["--quiet", "bench", "--size", "32", "--frames", "6", "--chunk", "3", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fmt", ["png", "mp4"])
def test_bench_reports_every_stage_of_the_flash_pipeline(fmt, capsys):
    r = bench(capsys, *TINY, "--device", "cpu", "--precision", "fp32", "--format", fmt)
    f = r["flash"]
    assert r["size"] == [32, 32] and r["device"] == "cpu" and r["dtype"] == "float32"
    assert r["weights"].startswith("RANDOM (dit-tiny")
    assert f["frames"] == 6 and set(f["ms_per_frame"]) == FLASH_STAGES
    assert all(v > 0 for v in f["ms_per_frame"].values())
    assert abs(6 / f["fps_overall"] - f["seconds"]) <= 0.006  # seconds is rounded to 0.01
    assert f["fps_steady"] > 0 and f["first_frame_latency_s"] > 0  # latency counts set-up, seconds do not
    assert r["first_frame_cold_s"] > 0  # the warm-up stream's (the process's first)
    assert r["peak_rss_mib"] > 0 and "peak_gpu_mib" not in r
    lat = f["chunk_latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= 1000 * f["seconds"]
    shade = r["shade"]  # the shading prior on the same G-buffers, one thread, chunks after the first
    assert shade["threads"] == 1 and shade["chunks"] >= 1 and shade["reflections"] is False  # the model's prior: plain here
    assert 0 < shade["ms_per_frame_median"] <= shade["ms_per_frame_worst"]
    # a thread's CPU time is within its wall time; the two medians (coarser clock, rounded to 0.01 ms) may cross
    # by a hair (seen: 1.57 against 1.56)
    assert 0 < shade["cpu_ms_per_frame_median"] <= 1.1 * shade["ms_per_frame_median"] + 0.05


def test_bench_leaves_the_shading_prior_out_when_told(capsys):
    assert "shade" not in bench(capsys, *TINY, "--device", "cpu", "--format", "png", "--no-shade")


@pytest.mark.slow
def test_bench_compares_the_teacher_on_the_same_input(capsys):
    r = bench(capsys, *TINY, "--device", "cpu", "--precision", "fp32", "--format", "png",
              "--compare-teacher", "--teacher-steps", "2")
    assert r["teacher"]["frames"] == r["flash"]["frames"] == 6
    assert set(r["teacher"]["ms_per_frame"]) == STAGES
    assert r["speedup"] == pytest.approx(r["flash"]["fps_overall"] / r["teacher"]["fps_overall"], rel=0.01)


def test_bench_runs_a_model_folder(capsys):
    model = Path(__file__).resolve().parents[1] / "model_zoo" / "default"
    r = bench(capsys, "--model", str(model), "--device", "cpu", "--format", "png")
    assert r["weights"] == str(model) and r["flash"]["frames"] == 6
    assert set(r["flash"]["ms_per_frame"]) == FLASH_STAGES  # the default ships a G-buffer refiner
    r = bench(capsys, "--model", str(model), "--refiner", "none", "--device", "cpu", "--format", "png")
    assert set(r["flash"]["ms_per_frame"]) == STAGES


@pytest.mark.parametrize("args, message", [
    (["--size", "40x32"], "--size 40x32: width and height must be multiples of 16"),
    (["--frames", "0"], "--frames and --chunk must be at least 1"),
])
def test_bench_refuses_bad_sizes(args, message, capsys):
    assert main(["--quiet", "bench", *TINY, "--device", "cpu", *args]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_on_cuda_reports_the_gpu_and_its_peak_memory(capsys):
    r = bench(capsys, *TINY, "--device", "cuda", "--precision", "bf16", "--format", "png")
    assert r["device"].startswith("cuda") and r["dtype"] == "bfloat16"
    assert r["gpu"] == torch.cuda.get_device_name(0) and r["peak_gpu_mib"] > 0
    assert set(r["flash"]["ms_per_frame"]) == FLASH_STAGES


def test_bench_without_a_refiner_has_no_refine_stage(capsys):
    r = bench(capsys, *TINY, "--refiner", "none", "--device", "cpu", "--precision", "fp32", "--format", "png")
    assert set(r["flash"]["ms_per_frame"]) == STAGES and r["weights"].endswith(", none)")


def test_profile_bench_profiles_a_plain_and_a_profiled_run(capsys):
    """benchmarks/profile_bench.py: a warm-up, a plain and a profiled bench of the same pipeline;
    the profile's table lists the operators that ran."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_bench.py"
    spec = importlib.util.spec_from_file_location("profile_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--size", "32", *TINY, "--frames", "4", "--rows", "5"]) == 0
    out = capsys.readouterr().out
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(reports) == 3 and all(r["flash"]["frames"] == 4 for r in reports)
    assert "Flash pipeline: run " in out and "profiled, CPU)" in out
    assert "aten::" in out  # the operators' table


def test_bench_times_the_release_structure_with_its_history_session(capsys):
    """--dit helios-flash-small: the release's Helios backbone (diffusers), its grouped encoder and
    taew2_1, streaming with the compressed-history sampler, no refiner."""
    pytest.importorskip("diffusers")
    r = bench(capsys, "--dit", "helios-flash-small", "--device", "cpu", "--precision", "fp32", "--format", "png")
    assert r["weights"] == "RANDOM (helios-flash-small, release grouped encoder (hidden 128), taew2_1, none)"
    assert r["flash"]["frames"] == 6 and set(r["flash"]["ms_per_frame"]) == STAGES
    assert main(["--quiet", "bench", "--dit", "helios-flash-9b", "--size", "32", "--frames", "2"]) == 2
    assert "unknown release backbone 'helios-flash-9b'" in capsys.readouterr().err


def test_bench_runs_sessions_at_once_over_one_model(capsys):
    """--sessions 2: two streams share the weights, each with its own state and writer; each one's
    figures are reported (the frames of each are checked by the sessions' own tests)."""
    r = bench(capsys, *TINY, "--device", "cpu", "--precision", "fp32", "--format", "png", "--sessions", "2")
    ss = r["sessions"]
    assert ss["count"] == 2 and len(ss["fps_steady"]) == len(ss["chunk_latency_ms"]) == 2
    assert all(v > 0 for v in ss["fps_steady"]) and ss["fps_steady_total"] == pytest.approx(sum(ss["fps_steady"]), abs=0.01)
    assert all(0 < c["p50"] <= c["p99"] for c in ss["chunk_latency_ms"])
