"""benchmarks/prompt_encoders.py: its classifiers and its wording splits (no encoder is loaded)."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports _common as a sibling
    try:
        spec = importlib.util.spec_from_file_location("prompt_encoders", BENCHMARKS / "prompt_encoders.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("prompt_encoders", None)
        sys.path.remove(str(BENCHMARKS))


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_both_classifiers_recover_separable_classes(bench):
    """Three well-separated clusters on the unit sphere: every held-out point lands in its own."""
    rng = np.random.default_rng(0)
    means = unit(rng.normal(size=(3, 16)))
    y_fit, y_test = np.repeat(np.arange(3), 20), np.repeat(np.arange(3), 10)
    x_fit = unit(means[y_fit] + 0.1 * rng.normal(size=(60, 16)))
    x_test = unit(means[y_test] + 0.1 * rng.normal(size=(30, 16)))
    assert (bench.nearest_centroid(x_fit, y_fit, x_test) == y_test).all()
    assert (bench.logistic_probe(x_fit, y_fit, x_test) == y_test).all()


def test_the_probe_finds_a_direction_the_centroids_miss(bench):
    """Classes apart along one quiet axis, with a loud axis that shifts the fit set's class means the
    wrong way: the nearest centroid is led by the loud axis, the probe reads the quiet one."""
    rng = np.random.default_rng(1)
    n = 200
    y = np.repeat([0, 1], n // 2)
    quiet = np.where(y == 1, 0.05, -0.05) + 0.005 * rng.normal(size=n)
    loud = rng.normal(size=n)
    loud_fit = loud + np.where(y == 1, -0.5, 0.5)  # only the fit set's loud axis leans on the class
    x_fit = np.stack([quiet, loud_fit, np.ones(n)], 1)
    x_test = np.stack([quiet, 2.0 * np.where(y == 1, 1.0, -1.0), np.ones(n)], 1)
    assert (bench.logistic_probe(x_fit, y, x_test) == y).mean() == 1.0
    assert (bench.nearest_centroid(x_fit, y, x_test) == y).mean() == 0.0


def test_scores_are_shares_of_own_labels(bench):
    x = np.eye(3)
    got = bench.scores(x, ["a", "b", "c"], x[[0, 1, 2, 0]], ["a", "b", "c", "b"])
    assert got["centroid"] == got["probe"] == 0.75
    assert got["probe_by_label"] == {"a": 1.0, "b": 0.5, "c": 1.0}


def test_held_out_wordings_and_side_phrases_are_never_fitted(bench):
    from alaya_flash.streaming.world.shading import PRESETS
    from alaya_flash.streaming.world.traced.presets import PHRASES, SIDES
    from alaya_flash.training.prompts import WORLD_V2_PARAPHRASES

    fit, labels, test, test_labels = bench.preset_split()
    assert not set(fit) & set(test)
    assert set(labels) == set(test_labels) == {*PRESETS, *WORLD_V2_PARAPHRASES}
    fit, sides, test, test_sides = bench.side_split()
    assert set(sides) == set(test_sides) == set(SIDES) and not set(fit) & set(test)
    project = [PHRASES[s].format(light=light) for s in SIDES for light in ("sun", "moon")]
    assert all(any(p in t for p in project) for t in fit)
    assert not any(p in t for p in project for t in test)
    for text, side in zip(test, test_sides):  # each held-out phrasing ends its text and names its own side
        assert any(text.endswith(", " + p.format(light=light)) for p in bench.HELDOUT_SIDES[side] for light in ("sun", "moon"))
