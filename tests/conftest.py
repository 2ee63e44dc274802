"""Test setup: import `alaya_flash` from this checkout, whatever is installed.

The repository root is the package, so we register it under its import name before any test
module imports it. Tests then exercise the tree they live in (worktrees, clean clones).
"""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Test tensors are tiny: one thread avoids OpenMP oversubscription, which made tiny-model tests
# 10-20x slower on the shared 2-core machine (measured: 1.3 s vs 25 s for the 10k-frame stream).
os.environ.setdefault("OMP_NUM_THREADS", "1")

if "alaya_flash" not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        "alaya_flash", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["alaya_flash"] = module
    spec.loader.exec_module(module)


class _RepoRootIsNotATestPackage:
    """Collect the repository root as a plain folder, not as a test package.

    The root's __init__.py is the package itself (relative imports). pytest would import it as a
    top-level module named after the checkout folder: that fails for a clone named `alaya-flash`
    or `clean-io` ("attempted relative import with no known parent package") and only works by
    accident for folder names like `io` (stdlib) or `main`.
    """

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path, parent):
        if path == ROOT:
            return pytest.Dir.from_parent(parent, path=path)
        return None


def pytest_configure(config):
    # Registered as a plugin (not a conftest hook) so it applies to the root, above tests/.
    config.pluginmanager.register(_RepoRootIsNotATestPackage(), "alaya-flash-repo-root")
    if config.pluginmanager.hasplugin("xdist"):  # its hook is only known with xdist installed
        config.pluginmanager.register(_WholeFilesToAWorker(), "alaya-flash-whole-files")


SESSION_RUNS = {"runs", "mixed"}  # the session fixtures below: training runs the test_training_*.py files read
TRAINING_FILES = "test_training_"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that reads the session's training runs is slow (they take a while to make). Under
    pytest-xdist the files with the most slow tests come first, so the long ones start early and the
    short ones fill in around them (see _WholeFilesToAWorker)."""
    for item in items:
        if SESSION_RUNS & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow = {}
        for item in items:
            slow[_scope(item.nodeid)] = slow.get(_scope(item.nodeid), 0) + bool(item.get_closest_marker("slow"))
        items.sort(key=lambda item: -slow[_scope(item.nodeid)])  # stable: files keep their own order


def _scope(nodeid: str) -> str:
    """What one xdist worker runs as a whole: a test file, or all the training files together."""
    file = nodeid.split("::", 1)[0]
    return TRAINING_FILES if Path(file).name.startswith(TRAINING_FILES) else file


class _WholeFilesToAWorker:
    """`pytest -n N` (make test: -n auto): each worker runs whole files, so a module fixture is made
    once, and the test_training_*.py files go to one worker together, so the session's training runs
    are made once. pytest-xdist's own `--dist loadgroup` would do this with marks, but does not group
    under pytest 9.2 (pytest-xdist issue #1386); an explicit --dist other than load is left alone."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getoption("dist") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ByFile(LoadScopeScheduling):
            def _split_scope(self, nodeid):
                return _scope(nodeid)

        config.option.loadscopereorder = False  # keep the workers' order: the slowest files first
        return ByFile(config, log)


@pytest.fixture(scope="session", autouse=True)
def prompt_store(tmp_path_factory):
    """The session's prompt store ($ALAYA_FLASH_PROMPT_STORE, model_zoo/prompt_store.py), never the user's:
    one folder for both xdist workers and every process the tests start, so a prompt one of them
    encoded is read back by the others (process_helpers.store_prompts). A test run in its own process
    keeps its parent's. (Compiled OpenVINO models stay in the user's cache, as a user's do.)"""
    if not (os.environ.get("ALAYA_FLASH_TEST_IN_OWN_PROCESS") and os.environ.get("ALAYA_FLASH_PROMPT_STORE")):
        base = tmp_path_factory.getbasetemp()
        folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "prompt-store"
        os.environ["ALAYA_FLASH_PROMPT_STORE"] = str(folder)
    return Path(os.environ["ALAYA_FLASH_PROMPT_STORE"])


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Every training stage run once on a tiny dataset (training_helpers.build_runs), shared by the
    test_training_*.py files: made once per session, not once per file.

    The stages encode the same wordings run after run: the process's MiniLM keeps every prompt it
    encoded for the session (its 64 suit a stream; each is encoded alone, so kept or encoded again
    it is the same tensor), about 240 encodings fewer in test_training_text_anchor.py alone."""
    from alaya_flash.model_zoo.bundle import load_text_encoder
    from alaya_flash.model_zoo.text_encoder import MINILM
    from training_helpers import build_runs

    load_text_encoder(MINILM).cache_size = 4096
    return build_runs(tmp_path_factory)


@pytest.fixture(scope="session")
def mixed(runs):
    """A second tiny world (other clips, other presets) and a student-rollout run that mixes it into
    half its steps (training_helpers.build_mixed)."""
    from training_helpers import build_mixed

    return build_mixed(runs)


@pytest.fixture(scope="session")
def world_v2_data(tmp_path_factory):
    """A tiny world v2 dataset (training_helpers.world_v2_config), path traced once for the training
    tests that read world v2 clips; they only read it."""
    from training_helpers import build_world_v2_data

    return build_world_v2_data(tmp_path_factory.mktemp("world-v2"))


# The networks run on torch in the tests unless a test asks for another runtime (tests/test_runtime.py
# compiles with OpenVINO explicitly, into its own temporary cache).
os.environ.setdefault("ALAYA_FLASH_BACKEND", "torch")


def _no_openvino_telemetry() -> None:
    """The tests send no OpenVINO telemetry. Without a consent file (~/intel/openvino_telemetry) its model
    converter sends events, each from a fork of the whole test process (posting fails here, without a
    network): that cost about a third of test_runtime.py's CPU time (6 s of children and 6 s of page
    copying per tiny model converted)."""
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return
    OptInChecker.check = lambda self, *args, **kwargs: ConsentCheckResult.DECLINED


_no_openvino_telemetry()
