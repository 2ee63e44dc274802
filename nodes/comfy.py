"""The only place that talks to ComfyUI: model folders, devices, progress bars, interruption.

Every comfy import is guarded: outside ComfyUI (tests, the CLI runner) these helpers fall back to
plain behaviour (no progress bar, never interrupted, the project's own model folders, CPU or CUDA).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger(__name__)

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
PROJECT_MODEL_DIRS = (PACKAGE_ROOT / "model_zoo",)  # model_zoo/default and any model folder beside it


def _folder_paths():
    try:
        import folder_paths  # ComfyUI's module

        return folder_paths
    except ImportError:
        return None


def in_comfyui() -> bool:
    return _folder_paths() is not None


def model_dirs(kind: str) -> list[Path]:
    """Folders searched for a kind of model file: ComfyUI's (diffusion_models, vae, vae_approx,
    text_encoders) when inside ComfyUI, else none; plus the project's model_zoo for diffusion_models."""
    out: list[Path] = list(PROJECT_MODEL_DIRS) if kind == "diffusion_models" else []
    fp = _folder_paths()
    if fp is not None:
        try:
            out += [Path(p) for p in fp.get_folder_paths(kind)]
        except Exception:  # an unknown key in an old ComfyUI: nothing to add
            log.debug("folder_paths has no %r", kind)
    return out


def searched(kind: str) -> str:
    dirs = model_dirs(kind)
    return ", ".join(str(d) for d in dirs) if dirs else f"(no {kind} folders outside ComfyUI)"


def list_entries(kind: str, folders: bool = False, suffix: str = ".safetensors") -> list[str]:
    """Names (relative to their search folder) of model folders (with config.json, or a Flash
    release's transformer_partial.safetensors) or files."""
    names: list[str] = []
    for root in model_dirs(kind):
        if not root.is_dir():
            continue
        if folders:
            marks = [m for pattern in ("config.json", "transformer_partial.safetensors")
                     for m in sorted(root.glob(f"*/{pattern}")) + sorted(root.glob(f"*/*/{pattern}"))]
            for mark in marks:
                names.append(mark.parent.relative_to(root).as_posix())
        else:
            for f in sorted(root.rglob(f"*{suffix}")):
                names.append(f.relative_to(root).as_posix())
    return sorted(dict.fromkeys(names))


def resolve(kind: str, name: str) -> Path | None:
    """An absolute path as given, else the first search folder holding `name`; None if none does."""
    p = Path(name)
    if p.is_absolute():
        return p if p.exists() else None
    for root in model_dirs(kind):
        if (root / name).exists():
            return root / name
    return None


def input_path(path: str) -> Path:
    """A user path: absolute as given; relative to ComfyUI's input folder inside ComfyUI, else the cwd.
    A relative `samples/...` path that is not there is the pack's bundled sample (samples/)."""
    p = Path(path).expanduser()
    fp = _folder_paths()
    if p.is_absolute():
        return p
    found = Path(fp.get_input_directory()) / p if fp is not None else p
    bundled = PACKAGE_ROOT / p
    if not found.exists() and p.parts[:1] == ("samples",) and bundled.exists():
        return bundled
    return found


def output_path(path: str) -> Path:
    """An output path: absolute as given; relative to ComfyUI's output folder inside ComfyUI, else the cwd."""
    p = Path(path).expanduser()
    fp = _folder_paths()
    if not p.is_absolute() and fp is not None:
        return Path(fp.get_output_directory()) / p
    return p


def view_entry(path: Path) -> dict | None:
    """{filename, subfolder, type} by which ComfyUI's frontend shows a file (its /view route), when
    the file lies in ComfyUI's output or temp folder; None outside ComfyUI or elsewhere."""
    fp = _folder_paths()
    if fp is None:
        return None
    path = Path(path).resolve()
    for kind, root in (("output", fp.get_output_directory()), ("temp", fp.get_temp_directory())):
        root = Path(root).resolve()
        if path.is_relative_to(root):
            sub = path.parent.relative_to(root).as_posix()
            return {"filename": path.name, "subfolder": "" if sub == "." else sub, "type": kind}
    return None


def preview_entry(frame: torch.Tensor, name: str) -> dict | None:
    """Write one IMAGE frame (H, W, 3) as a PNG in ComfyUI's temp folder and return its view entry
    (what ComfyUI's Preview Image does); None outside ComfyUI."""
    fp = _folder_paths()
    if fp is None:
        return None
    from PIL import Image

    from ..streaming.files.sinks import to_uint8

    folder = Path(fp.get_temp_directory())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"alaya-flash-{name}.png"
    Image.fromarray(to_uint8(frame[None])[0]).save(path, compress_level=1)
    return view_entry(path)


def torch_device(choice: str = "auto") -> torch.device:
    """'auto': ComfyUI's device inside ComfyUI, else CUDA when present, else CPU."""
    from ..model_zoo.precision import choose_device

    if choice != "auto":
        return choose_device(choice)
    try:
        import comfy.model_management as mm

        return mm.get_torch_device()
    except ImportError:
        return choose_device("auto")


def torch_dtype(choice: str, device: torch.device) -> torch.dtype:
    """'auto': bf16 on CUDA and on CPUs with fast bf16 (AMX), else float32."""
    from ..model_zoo.precision import choose_dtype

    return choose_dtype(choice, device)


PREVIEW_SIDE = 512  # pixels: a larger preview frame is scaled down to fit


class Progress:
    """ComfyUI's progress bar for one node run, with an optional preview frame; a no-op outside.

    update() also checks for interruption (ComfyUI's hook raises when the user pressed cancel).
    """

    def __init__(self, total: int):
        self.total, self.done = max(1, total), 0
        try:
            import comfy.utils

            self.bar = comfy.utils.ProgressBar(self.total)
        except ImportError:
            self.bar = None

    def update(self, n: int = 1, preview: torch.Tensor | None = None) -> None:
        """Advance n steps; preview is one IMAGE frame (H, W, 3) float [0, 1]."""
        self.done = min(self.total, self.done + n)
        check_interrupted()
        if self.bar is None:
            return
        image = None
        if preview is not None:
            from PIL import Image

            from ..streaming.files.sinks import to_uint8

            frame = Image.fromarray(to_uint8(preview))
            # ComfyUI scales a preview to fit its max size, up as well as down: None keeps a small frame at
            # its own size (a 128x128 render was shown, and labelled, 512 x 512)
            image = ("JPEG", frame, PREVIEW_SIDE if max(frame.size) > PREVIEW_SIDE else None)
        self.bar.update_absolute(self.done, self.total, image)


def check_interrupted() -> None:
    """Raise ComfyUI's interruption exception if the user cancelled (no-op outside ComfyUI)."""
    try:
        import comfy.model_management as mm
    except ImportError:
        return
    mm.throw_exception_if_processing_interrupted()


PIECE_SECONDS = 0.25  # a node's loop checks for cancel at least this often (pieces sized by measured time)
HOOK_SECONDS = 0.02  # inside a model's forward pass: a cancel check at most this often


class PieceClock:
    """Sizes a loop's pieces by measured time, not by a count of frames: the first piece is one unit, each
    next one as many units as the last ones' rate fits in PIECE_SECONDS (at most twice the last, at most
    `most`), so the cancel checks between pieces come about that often on a fast machine or a busy one."""

    def __init__(self, most: int | None = None, target: float | None = None):
        self.size, self.most = 1, most
        self.target = PIECE_SECONDS if target is None else target

    def took(self, units: int, seconds: float) -> None:
        fits = int(self.target * max(units, 1) / seconds) if seconds > 0 else 2 * self.size
        self.size = max(1, min(fits, 2 * self.size, self.most or fits))


_hook_users = 0
_hook_handle = None
_hook_last = 0.0


def _forward_check(_module, _args) -> None:
    global _hook_last
    now = time.monotonic()
    if now - _hook_last >= HOOK_SECONDS:
        _hook_last = now
        check_interrupted()


COMFY_THREADS = "ALAYA_FLASH_COMFY_THREADS"  # torch threads of a pack node's work inside ComfyUI on a CPU (0: ComfyUI's)


@contextmanager
def node_run():
    """How a pack node's work runs inside ComfyUI (a no-op outside): cancel points in every module
    forward (cancel_points) and, on a CPU, one torch thread (ALAYA_FLASH_COMFY_THREADS to change it),
    restored afterwards. Operations split over all cores collapse when another busy process holds one:
    OpenMP's threads wait at every barrier for the busy core (docs/benchmarks.md, "On the CPU"), which
    made a refiner frame seconds long and a cancel wait for it."""
    threads = _node_threads()
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with cancel_points():
            yield
    finally:
        if threads:
            torch.set_num_threads(before)


def _node_threads() -> int:
    """Torch threads for a pack node inside ComfyUI on a CPU; 0: leave ComfyUI's."""
    import os

    if not in_comfyui() or torch_device("auto").type != "cpu":
        return 0
    try:
        return max(0, int(os.environ.get(COMFY_THREADS, "1")))
    except ValueError:
        log.warning("%s=%r is not a number of threads; using 1", COMFY_THREADS, os.environ[COMFY_THREADS])
        return 1


@contextmanager
def cancel_points():
    """Inside ComfyUI, for the block: a cancel check before every torch module's forward (at most every
    HOOK_SECONDS), so a cancel lands inside one frame's work too, however slow a busy machine makes it.
    The stages keep their state (KV caches, codec memories) outside the modules and are discarded when a
    prompt is interrupted, so stopping mid-forward leaves nothing half-changed. A no-op outside ComfyUI."""
    global _hook_users, _hook_handle
    if not in_comfyui():
        yield
        return
    with _hook_lock:
        _hook_users += 1
        if _hook_handle is None:
            _hook_handle = torch.nn.modules.module.register_module_forward_pre_hook(_forward_check)
    try:
        yield
    finally:
        with _hook_lock:
            _hook_users -= 1
            if not _hook_users and _hook_handle is not None:
                _hook_handle.remove()
                _hook_handle = None


_hook_lock = threading.Lock()
_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alaya-flash")


def interruptible(fn, *args, **kwargs):
    """fn(*args, **kwargs), and inside ComfyUI a cancel that lands while it runs: fn runs on the pack's
    worker thread while this thread checks for cancel every 20 ms. For work with no loop to check in
    (importing transformers, reading a model's files: seconds on a busy machine). A cancelled call goes on
    to its end in the background (its result, a loaded model, is dropped); calls run one at a time."""
    if not in_comfyui():
        return fn(*args, **kwargs)
    with cancel_points():
        job = _worker.submit(fn, *args, **kwargs)
        while True:
            try:
                return job.result(timeout=0.02)
            except FuturesTimeout:
                check_interrupted()


def intermediate(t: torch.Tensor) -> torch.Tensor:
    """Where IMAGE outputs live (ComfyUI's intermediate device; the CPU outside)."""
    try:
        import comfy.model_management as mm

        return t.to(mm.intermediate_device())
    except ImportError:
        return t.cpu()
