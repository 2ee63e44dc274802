"""A pool of batch workers on Ray: one actor per worker process, each holding the models once and
rendering one job per task (a whole shot, or one part of a long one). The scheduler, manifest and retries are render/batch.py's; this
module only supplies the workers. Ray is imported here and nowhere else, when a batch uses it.

Without an address a private Ray starts on this machine (127.0.0.1, no dashboard, a small object
store: only shot descriptions and results travel through it) and stops with the pool, or with the
batch process however it ends (`kill -9` included: ray_reaper.py stops what Ray leaves); with one
(`ray start --head` on a cluster) the pool joins it and leaves it running. When Ray is already
initialised in this process (a notebook, a test), the pool uses that.

A worker process that dies mid-shot (killed, out of memory, a crashed node) fails only its shot's
attempt: the pool starts a new actor in its place and the scheduler gives the shot to the next
free worker.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ...model_zoo.errors import AlayaError
from . import ray_reaper

log = logging.getLogger(__name__)

OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's minimum is 75 MiB; shots and results are a few KiB each
STATUS_SECONDS = 0.2  # how long statuses() waits for busy workers' answers


def available() -> bool:
    """Ray is installed (the `ray` extra)."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray runs single-node on the loopback address


def connect(address: str | None, local_cpus: int | None = None, debug: bool = False) -> "LocalRay | None":
    """Join the cluster at `address`, or start a private Ray here; the private Ray when this call
    started one (its caller stops it), else None. Ray already initialised in this process is used as it is."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return None
    if address:
        host = address.rsplit(":", 1)[0]
        with _loopback(host in ("127.0.0.1", "localhost")):  # a cluster on this machine's loopback: stay on it
            import ray

            try:
                ray.init(address=address, log_to_driver=debug, configure_logging=False)
            except Exception as err:  # noqa: BLE001  (Ray raises several kinds; each is one line here)
                raise AlayaError(join_refusal(address, err)) from None
        return None
    return start_local(local_cpus or os.cpu_count() or 1, debug)


def join_refusal(address: str, err: Exception) -> str:
    """One line for a cluster that could not be joined, with the token hint where auth is the likely
    cause (a cluster started with RAY_AUTH_MODE=token refuses a driver without it, in its own words)."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    hint = ("; a cluster started with token authentication needs RAY_AUTH_MODE=token in this process's "
            "environment and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, or `ray get-auth-token` on the head "
            "node)") if os.environ.get("RAY_AUTH_MODE", "") != "token" or not _token_given() else \
        "; RAY_AUTH_MODE=token is set: check that the token is the cluster's"
    return f"--address {address}: could not join the Ray cluster ({type(err).__name__}: {first[:300]}){hint}"


def _token_given() -> bool:
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or os.path.isfile(os.path.expanduser("~/.ray/auth_token")))


def cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


@dataclass
class LocalRay:
    """A private Ray this process started: its processes carry `marker` (ray_reaper.VAR) and `reaper`
    stops them once this process is gone. Keep it referenced until stop(): its pipe is the reaper's stdin."""

    marker: str
    reaper: subprocess.Popen

    def stop(self) -> None:
        """Stop Ray, then let the reaper stop whatever of it still runs."""
        import ray

        try:
            ray.shutdown()
        finally:
            self.reaper.stdin.close()
            try:
                self.reaper.wait(ray_reaper.GRACE_SECONDS + 5)
            except subprocess.TimeoutExpired:
                log.warning("the Ray reaper (pid %d) is still stopping Ray's processes", self.reaper.pid)


def start_local(cpus: int, debug: bool = False) -> LocalRay:
    """A private single-node Ray that listens on 127.0.0.1 only: no dashboard, `cpus` CPUs, a small
    object store; its processes stop with this one however it ends (ray_reaper.py). Processes an
    earlier private Ray left (its batch and reaper both killed) are stopped first."""
    stale = ray_reaper.sweep_orphans()
    if stale:
        log.warning("stopped %d process(es) a killed batch's private Ray left running", len(stale))
    marker = f"{os.getpid()}-{secrets.token_hex(8)}"
    reaper = subprocess.Popen([sys.executable, str(Path(ray_reaper.__file__)), marker, str(os.getpid())],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    local = LocalRay(marker, reaper)
    try:
        with _loopback(), _environ(ray_reaper.VAR, marker):  # Ray's processes inherit the marker
            import ray

            ray.init(num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=OBJECT_STORE_BYTES, log_to_driver=debug, configure_logging=False)
    except BaseException:
        local.stop()
        raise
    return local


@contextlib.contextmanager
def _environ(name: str, value: str):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def _loopback(on: bool = True):
    """Keep Ray on 127.0.0.1. On Linux Ray advertises and binds the machine's network address even when
    told 127.0.0.1 (and a client turns 127.0.0.1 into that address) unless its cluster mode is off,
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (the default on macOS). Ray reads the setting when it is first
    imported (then it holds for this process) and when its processes start (they inherit it)."""
    if not on:
        yield
        return
    before = os.environ.get(LOOPBACK_VAR)
    os.environ[LOOPBACK_VAR] = "0"
    constants = previous = None
    if "ray" in sys.modules:  # imported earlier, with the setting it read then: switch it for now
        try:
            from ray._private import ray_constants as constants

            previous, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, False
        except (ImportError, AttributeError):
            constants = None
    try:
        yield
    finally:
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = previous
        if before is None:
            os.environ.pop(LOOPBACK_VAR, None)
        else:
            os.environ[LOOPBACK_VAR] = before


class RayPool:
    """Workers as Ray actors of `worker_cls(**worker_kwargs, worker=ID)` (its render(job), status(),
    close()); each reserves `cpus` CPUs and `gpus` GPUs (a fraction shares a GPU)."""

    def __init__(self, worker_cls: type, worker_kwargs: dict, *, workers: int | None, cpus: float, gpus: float = 0.0,
                 address: str | None = None, local_cpus: int | None = None, most: int | None = None,
                 debug: bool = False):
        self.local = connect(address, local_cpus, debug)
        import ray

        self.ray = ray
        try:
            self.size = self._size(workers, cpus, gpus, most)
            self.cpus, self.gpus, self.kwargs = cpus, gpus, worker_kwargs
            self.actor_cls = ray.remote(worker_cls)
            self.actors = {f"w{i + 1}": self._start(f"w{i + 1}") for i in range(self.size)}
        except BaseException:
            self.close()
            raise
        self.idle = list(self.actors)
        self.running: dict = {}  # object ref -> (worker id, the caller's tag)
        self.restarts = 0
        self.last_status: dict[str, dict] = {}

    def _size(self, workers: int | None, cpus: float, gpus: float, most: int | None) -> int:
        """Workers that fit the cluster's CPUs and GPUs at once (asked for more: an error, since Ray
        would leave the rest waiting for resources forever)."""
        have = self.ray.cluster_resources()
        fits = [int(have.get("CPU", 0) // cpus)] if cpus > 0 else []
        if gpus > 0:
            fits.append(int(have.get("GPU", 0) // gpus))
        fit = min(fits) if fits else 1
        if fit < 1 or (workers is not None and workers > fit):
            raise AlayaError(f"--workers {workers or 1} with {cpus:g} CPU and {gpus:g} GPU each: the Ray cluster has "
                             f"{have.get('CPU', 0):g} CPU and {have.get('GPU', 0):g} GPU, room for {max(fit, 0)} worker(s)")
        n = workers or fit
        return max(1, min(n, most)) if most else n

    def _start(self, wid: str):
        options = {"num_cpus": self.cpus, "num_gpus": self.gpus, "max_concurrency": 2,  # status() while render() runs
                   "max_restarts": 0}  # a dead worker is replaced by a new actor (self._replace)
        return self.actor_cls.options(**options).remote(**self.kwargs, worker=wid)

    def free(self) -> bool:
        return bool(self.idle)

    def busy(self) -> bool:
        return bool(self.running)

    def submit(self, tag, job: dict) -> None:
        wid = self.idle.pop(0)
        self.running[self.actors[wid].render.remote(job)] = (wid, tag)

    def poll(self, timeout: float, tick=None) -> list:
        """Jobs finished within `timeout` seconds, as (tag, result); a worker that died mid-job gives
        a failed result and is replaced."""
        ray = self.ray
        refs = list(self.running)
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out = []
        for ref in ready:
            wid, tag = self.running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                seen = self.last_status.get(wid, {})
                result = {"ok": False, "worker": wid, "host": seen.get("host"), "frames": seen.get("frames", 0),
                          "error": f"worker {wid} (pid {seen.get('pid', '?')}) died during the shot: "
                                   f"{str(err).splitlines()[0][:200]}"}
                self._replace(wid)
            except ray.exceptions.RayError as err:  # the task itself broke (render() returns its errors)
                result = {"ok": False, "worker": wid, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
            self.idle.append(wid)
            out.append((tag, result))
        return out

    def _replace(self, wid: str) -> None:
        log.warning("worker %s died; starting a new one in its place", wid)
        try:
            self.ray.kill(self.actors[wid])
        except Exception:  # noqa: BLE001  (already gone)
            pass
        self.actors[wid] = self._start(wid)
        self.restarts += 1
        self.last_status.pop(wid, None)

    def statuses(self) -> list[dict]:
        """Each worker's status (its shot and frames so far); a worker slow to answer shows its last one."""
        ray = self.ray
        asked = {a.status.remote(): wid for wid, a in self.actors.items()}
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=STATUS_SECONDS)
        for ref in ready:
            try:
                self.last_status[asked[ref]] = ray.get(ref)
            except ray.exceptions.RayError:
                self.last_status[asked[ref]] = {"worker": asked[ref], "state": "lost"}
        return [self.last_status.get(wid, {"worker": wid, "state": "starting"}) for wid in self.actors]

    def close(self) -> None:
        """Stop the workers; stop Ray too when this pool started it."""
        for actor in getattr(self, "actors", {}).values():
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
        if self.local is not None:
            self.local.stop()
