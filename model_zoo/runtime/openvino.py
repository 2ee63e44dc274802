"""The Flash networks compiled by OpenVINO, behind the torch networks' interfaces.

Each network's streaming step (graphs.py) is converted once per frame size and precision, saved as
OpenVINO IR under the cache folder, and compiled from there with OpenVINO's own compiled-blob cache
beside it, so a later process (or stream) loads the compiled model instead of converting and
compiling again. The folder's name is a hash of the weights, the graph, the input shapes, the
precision and OpenVINO's version: new weights or another version never read a stale model.

Cache folder: $ALAYA_FLASH_CACHE, else $XDG_CACHE_HOME/alaya-flash, else ~/.cache/alaya-flash;
compiled models go in its openvino/ subfolder.

Threads: a model compiles for the calling thread's torch thread count (a pipeline lane's share of
the CPU, render/cpu.py), once per count. Precision: bf16 when the torch network was loaded in bf16
(model_zoo/precision.py measured it fast on this CPU), else f32.

One OpenVINO Core serves the process (core()): each Core's CPU plugin gives the thread that creates
it an alternate signal stack, which it unmaps when it goes, putting back the stack it found only if
its own is still current. Plugins released in any order but the reverse of their making left a
thread's alternate stack pointing at unmapped memory, and the next signal that thread took (Python's
handlers run on the alternate stack) killed the process with SIGSEGV. One plugin, kept for the
process's life, never unmaps a stack in use.

Codec memory (the MemBlocks' last frames) lives inside the runtime as the infer request's state
(one request per stream), in the runtime's own layout; the DiT's KV cache stays a model_zoo KVCache
that each pass reads and writes.

Infer requests are pooled per compiled model (Requests): a stream takes one for its life and gives it
back when it goes, the DiT and the refiner take one per call. An infer request owns its buffers, so a
request per stream or per thread allocated them anew for every stream (the lanes' threads are new
each stream), and glibc kept what the old ones freed: bench's second stream at 256x256 grew the peak
RSS from 780 to 1,006 MiB.
"""
from __future__ import annotations

import copy
import hashlib
import shutil
import tempfile
import threading
import warnings
import weakref
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..dit import PromptContext, WanDiT, rope_freqs, apply_rope
from ..cache_home import cache_home
from ..errors import AlayaError
from ..kv_cache import KVCache
from ..latents import TIME_COMPRESSION
from ..loading import weights_hash
from . import graphs

GRAPH_VERSION = 1  # bump when graphs.py changes what a graph computes: old cache entries are then ignored


def cache_root() -> Path:
    """Where compiled models are kept (see the module docstring)."""
    return cache_home() / "openvino"


_core = None
_core_lock = threading.Lock()


def core():
    """The process's one OpenVINO Core (see the module docstring for why one). Thread-safe, as is
    compiling on it from several threads."""
    global _core
    with _core_lock:
        if _core is None:
            import openvino as ov

            _core = ov.Core()
        return _core


def _precision(module: nn.Module) -> str:
    return "bf16" if next(module.parameters()).dtype == torch.bfloat16 else "f32"


class Requests:
    """A compiled model and its idle infer requests (see the module docstring). Thread-safe."""

    def __init__(self, compiled):
        self.compiled = compiled
        self.idle: list = []
        self.made = 0  # requests created (the most ever in use at once)
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            if self.idle:
                return self.idle.pop()
            self.made += 1
        return self.compiled.create_infer_request()

    def give(self, request) -> None:
        with self.lock:
            self.idle.append(request)

    @contextmanager
    def borrow(self):
        """A request for one call (read its outputs before the block ends: they are the request's)."""
        request = self.take()
        try:
            yield request
        finally:
            self.give(request)

    def take_for(self, owner):
        """A request for `owner`'s life, its state zeroed; it comes back when the owner is collected
        (or when the returned finalizer is called)."""
        request = self.take()
        request.reset_state()  # zeros: a request's state may hold another stream's (or be uninitialised)
        return request, weakref.finalize(owner, self.give, request)


class _Compiler:
    """Compiled models of one network, by (graph variant, input shapes, threads), each with its pool
    of infer requests (Requests): converted and cached on disk once, compiled once per process.
    Thread-safe."""

    def __init__(self, network: nn.Module, kind: str):
        self.network, self.kind = network, kind
        self.precision = _precision(network)
        self.weights = weights_hash(network)
        self.compiled: dict[tuple, Requests] = {}
        self.lock = threading.Lock()

    def get(self, variant: str, make_graph, example: dict[str, torch.Tensor], stateful: dict[str, str] | None = None) -> Requests:
        """The compiled model (with its requests) for a graph variant fed `example` (name -> tensor, in forward's order)."""
        threads = torch.get_num_threads()
        shapes = tuple((n, tuple(t.shape), str(t.dtype)) for n, t in example.items())
        key = (variant, shapes, threads)
        with self.lock:
            if key not in self.compiled:
                folder = self._folder(variant, shapes)
                if not (folder / "model.xml").exists():
                    self._convert(folder, make_graph, example, stateful)
                config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                          "INFERENCE_PRECISION_HINT": self.precision, "CACHE_DIR": str(folder / "compiled")}
                self.compiled[key] = Requests(core().compile_model(str(folder / "model.xml"), "CPU", config))
            return self.compiled[key]

    def _folder(self, variant: str, shapes) -> Path:
        import openvino as ov

        text = f"{self.kind}|{variant}|{shapes}|{self.precision}|{self.weights}|{ov.__version__}|{GRAPH_VERSION}"
        return cache_root() / f"{self.kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"

    def _convert(self, folder: Path, make_graph, example: dict[str, torch.Tensor], stateful) -> None:
        """Trace the graph in float32, convert it with static shapes, save the IR (atomically: a folder
        renamed into place, so a crash or a second process never leaves half a model)."""
        import openvino as ov

        graph = make_graph().eval()
        with torch.no_grad(), warnings.catch_warnings():
            # static shapes: the networks' input checks become constants in the trace, as they should; say
            # nothing of it on a user's console
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            model = ov.convert_model(graph, example_input=tuple(example.values()),
                                     input=[tuple(t.shape) for t in example.values()])
        for param, name in zip(model.get_parameters(), example):
            param.output(0).get_tensor().set_names({name})
            param.set_friendly_name(name)
        if stateful:  # memory inputs fed back from outputs, held inside the infer request
            from openvino._offline_transformations import apply_make_stateful_transformation

            results = model.get_results()
            pairs = {}
            for inp, out_index in stateful.items():
                results[out_index].output(0).get_tensor().set_names({f"{inp}_out"})
                pairs[inp] = f"{inp}_out"
            apply_make_stateful_transformation(model, pairs)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        try:
            ov.save_model(model, str(tmp / "model.xml"), compress_to_fp16=False)
            try:
                tmp.rename(folder)
            except OSError:  # another process converted it first: keep theirs
                if not (folder / "model.xml").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().contiguous().numpy()


# ------------------------------------------------------------------------------------ codecs


class CompiledEncoder:
    """A GBufferEncoder's stand-in: `new_stream()` gives a stream with GBufferEncoderStream's encode()."""

    backend = "openvino"

    def __init__(self, encoder: nn.Module):
        self.torch_encoder = encoder
        self.config = encoder.config
        self.compiler = _Compiler(encoder, "gbuffer-encoder")

    def parameters(self):
        return self.torch_encoder.parameters()

    def new_stream(self) -> "EncoderStream":
        return EncoderStream(self)

    def compiled(self, height: int, width: int):
        graph = lambda: graphs.EncoderGroup(self.torch_encoder)  # noqa: E731
        memory = graphs.EncoderGroup.memory_shapes_for(self.torch_encoder, height, width)
        example = {"images": torch.zeros(TIME_COMPRESSION, self.config.branches, height, width, 3, dtype=torch.uint8)}
        example.update({f"memory{i}": torch.zeros(s) for i, s in enumerate(memory)})
        return self.compiler.get("group", graph, example, {f"memory{i}": i + 1 for i in range(len(memory))})


class EncoderStream:
    """GBufferEncoderStream on the runtime: uint8 teacher-form frames in, a latent per 4 frames out
    (frame 0 alone gives latent 0), the memory inside the infer request."""

    def __init__(self, encoder: CompiledEncoder):
        self.encoder = encoder
        self.request = self.release = None
        self.size: tuple[int, int] | None = None
        self.reset()

    def reset(self) -> None:
        if self.request is not None:
            self.request.reset_state()
        self.pending: list[torch.Tensor] = []
        self.started = False

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor | None:
        if images.ndim == 6:
            if images.shape[0] != 1:
                raise AlayaError(f"G-buffer encoder (openvino): one stream at a time, got a batch of {images.shape[0]}")
            images = images[0]
        if images.ndim == 4:
            images = images.unsqueeze(0)
        if images.dtype != torch.uint8 or images.ndim != 5 or images.shape[1] != self.encoder.config.branches:
            raise AlayaError(f"G-buffer encoder (openvino): expected uint8 teacher form (T, 5, H, W, 3), "
                             f"got {images.dtype} {tuple(images.shape)}")
        if images.shape[0] == 0:
            return None
        size = tuple(images.shape[2:4])
        if size[0] % 8 or size[1] % 8:
            raise AlayaError(f"G-buffer encoder input: frame size {size} must be a multiple of 8")
        if self.request is None or size != self.size:
            if self.started:
                raise AlayaError(f"G-buffer encoder: frame size changed mid-stream from {self.size} to {size}; reset() first")
            if self.release is not None:
                self.release()
            self.request, self.release = self.encoder.compiled(*size).take_for(self)
            self.size = size
        frames = list(images.cpu().unbind(0))
        if not self.started:  # Wan alignment: frame 0 alone makes latent 0 (frame 0 four times)
            self.started = True
            self.pending = [frames[0]] * (TIME_COMPRESSION - 1)
        self.pending += frames
        latents = []
        while len(self.pending) >= TIME_COMPRESSION:
            group = torch.stack(self.pending[:TIME_COMPRESSION]).numpy()
            self.pending = self.pending[TIME_COMPRESSION:]
            latents.append(torch.from_numpy(self.request.infer({"images": group})[0].copy()))
        return torch.stack(latents, 2) if latents else None


class CompiledDecoder:
    """A TinyCodec's stand-in for decoding: `new_stream()` gives TinyStream's decode() and reset()."""

    backend = "openvino"

    def __init__(self, codec: nn.Module):
        self.torch_codec = codec
        self.config = codec.config
        self.compiler = _Compiler(codec.decoder, "tiny-decoder")

    def parameters(self):
        return self.torch_codec.parameters()

    def new_stream(self) -> "DecoderStream":
        return DecoderStream(self)

    def compiled(self, height: int, width: int):
        graph = lambda: graphs.DecoderLatent(self.torch_codec)  # noqa: E731
        memory = graphs.DecoderLatent.memory_shapes_for(self.torch_codec, height, width)
        example = {"z": torch.zeros(1, self.config.latent_channels, height, width)}
        example.update({f"memory{i}": torch.zeros(s) for i, s in enumerate(memory)})
        return self.compiler.get("latent", graph, example, {f"memory{i}": i + 1 for i in range(len(memory))})


class DecoderStream:
    """TinyStream.decode on the runtime: a latent in, its 4 frames out (the stream's first 3 trimmed)."""

    def __init__(self, decoder: CompiledDecoder):
        self.decoder = decoder
        self.request = self.release = None
        self.size: tuple[int, int] | None = None
        self.reset()

    def reset(self) -> None:
        if self.request is not None:
            self.request.reset_state()
        self.to_trim = self.decoder.config.frames_to_trim
        self.started = False

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor | None:
        """latents (1, 16, h, w) or (1, 16, t, h, w) -> frames (1, k, 3, H, W) in [0, 1], or None."""
        if latents.ndim == 4:
            latents = latents.unsqueeze(2)
        c = self.decoder.config.latent_channels
        if latents.ndim != 5 or latents.shape[0] != 1 or latents.shape[1] != c:
            raise AlayaError(f"tiny decoder (openvino): expected latents (1, {c}, t, h, w), got {tuple(latents.shape)}")
        size = tuple(latents.shape[3:])
        if self.request is None or size != self.size:
            if self.started:
                raise AlayaError(f"tiny decoder: latent size changed mid-stream from {self.size} to {size}; reset() first")
            if self.release is not None:
                self.release()
            self.request, self.release = self.decoder.compiled(*size).take_for(self)
            self.size = size
        frames = []
        for i in range(latents.shape[2]):
            self.started = True
            out = self.request.infer({"z": _numpy(latents[:, :, i])})[0]
            frames.append(torch.from_numpy(out.copy()))
        frames = torch.cat(frames)
        trim = min(self.to_trim, frames.shape[0])
        self.to_trim -= trim
        frames = frames[trim:]
        return frames.unsqueeze(0) if frames.shape[0] else None


class CompiledRefiner:
    """A GBufferRefiner's stand-in: refine() frame by frame on the runtime (a pooled infer request per call)."""

    backend = "openvino"

    def __init__(self, refiner: nn.Module):
        self.torch_refiner = refiner
        self.config = refiner.config
        self.compiler = _Compiler(refiner, "gbuffer-refiner")
        self.pools: dict[tuple, Requests] = {}

    @property
    def text_dim(self) -> int:
        return self.torch_refiner.text_dim

    def parameters(self):
        return self.torch_refiner.parameters()

    def _requests(self, height: int, width: int) -> Requests:
        key = (height, width, torch.get_num_threads())
        if key not in self.pools:
            example = {"rgb": torch.zeros(1, height, width, 3),
                       "gbuffers": torch.zeros(1, 5, height, width, 3, dtype=torch.uint8)}
            if self.text_dim:
                example["text"] = torch.zeros(1, self.text_dim)
            graph = lambda: graphs.RefinerFrame(copy.deepcopy(self.torch_refiner).float())  # noqa: E731
            self.pools[key] = self.compiler.get("frame", graph, example)
        return self.pools[key]

    @torch.no_grad()
    def refine(self, frames: torch.Tensor, gbuffers: torch.Tensor, text: torch.Tensor | None = None,
               light: torch.Tensor | None = None, depth_near: float = 0.5, up: torch.Tensor | None = None) -> torch.Tensor:
        """As GBufferRefiner.refine; light, depth_near and up are for light-reading refiners, which stay on torch."""
        if frames.shape[0] != gbuffers.shape[0] or tuple(frames.shape[1:3]) != tuple(gbuffers.shape[2:4]):
            raise AlayaError(f"G-buffer refiner: frames {tuple(frames.shape)} and G-buffers {tuple(gbuffers.shape)} "
                             "differ in count or size")
        if self.text_dim and (text is None or len(text) != len(frames)):
            raise AlayaError(f"G-buffer refiner: this refiner reads the prompt: it needs one embedding per frame "
                             f"({len(frames)}), got {None if text is None else len(text)}")
        if gbuffers.dtype != torch.uint8:
            raise AlayaError(f"G-buffer refiner: expected uint8 G-buffers, got {gbuffers.dtype}")
        outs = []
        with self._requests(*frames.shape[1:3]).borrow() as request:
            for t in range(frames.shape[0]):  # one frame per call, as the torch refiner
                feed = {"rgb": _numpy(frames[t:t + 1]), "gbuffers": gbuffers[t:t + 1].cpu().contiguous().numpy()}
                if self.text_dim:
                    feed["text"] = _numpy(text[t:t + 1])
                outs.append(torch.from_numpy(request.infer(feed)[0].copy()))
        return torch.cat(outs) if outs else frames


# ------------------------------------------------------------------------------------ DiT


class CompiledDiT(nn.Module):
    """A WanDiT whose cached passes (the KV-cache sampler's) run on the runtime; everything else (the
    prompt's keys and values, whole-sequence passes, training with gradients) runs the torch DiT.
    Its KV caches hold float32, the runtime's input type."""

    backend = "openvino"

    def __init__(self, dit: WanDiT):
        super().__init__()
        self.dit = dit
        self.compiler = _Compiler(dit, "dit")
        self._embeds: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._prompt: tuple[PromptContext, dict[str, np.ndarray]] | None = None

    @property
    def config(self):
        return self.dit.config

    def tokens_per_frame(self, height: int, width: int) -> int:
        return self.dit.tokens_per_frame(height, width)

    def prepare_prompt(self, prompt_emb: torch.Tensor) -> PromptContext:
        return self.dit.prepare_prompt(prompt_emb)

    def time_embed(self, t: torch.Tensor):
        return self.dit.time_embed(t)

    def new_cache(self, batch: int, height: int, width: int, *, window_frames: int, sink_frames: int = 0,
                  rope: str = "relative") -> KVCache:
        cfg = self.dit.config
        return KVCache(num_layers=cfg.num_layers, batch=batch, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                       tokens_per_frame=self.tokens_per_frame(height, width), window_frames=window_frames,
                       sink_frames=sink_frames, rope=rope, rope_positions=cfg.rope_positions, dtype=torch.float32)

    def forward(self, x, t, prompt, *, chunk_frames=None, cache: KVCache | None = None, start_frame: int = 0):
        t = torch.as_tensor(t)
        if cache is None or chunk_frames is not None or torch.is_grad_enabled() or t.ndim > 1 or x.ndim != 5:
            return self.dit(x, t, prompt, chunk_frames=chunk_frames, cache=cache, start_frame=start_frame)
        return self._cached_pass(x, t, prompt, cache, start_frame)

    def _text(self, prompt: PromptContext | torch.Tensor) -> dict[str, np.ndarray]:
        """The prompt's inputs, kept while the same PromptContext comes back (once per prompt)."""
        if not isinstance(prompt, PromptContext):
            prompt = self.dit.prepare_prompt(prompt)
        if self._prompt is None or self._prompt[0] is not prompt:
            if prompt.keys[0].shape[2] == 1:  # one token: the cross-attention's output is o(v) for every query
                out = torch.stack([b.cross_attn.single_key(v).float() for b, v in zip(self.dit.blocks, prompt.values)])
                text = {"text_b": _numpy(out)}
            else:
                text = {"text_a": _numpy(torch.stack(prompt.keys)), "text_b": _numpy(torch.stack(prompt.values))}
            self._prompt = (prompt, text)
        return self._prompt[1]

    def _embed(self, t: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        key = tuple(t.tolist())
        if key not in self._embeds:
            if len(self._embeds) > 64:  # a stream uses a handful of timesteps; training may use many
                self._embeds.clear()
            with torch.no_grad():
                t_emb, t_mod = self.dit.time_embed(t.float())
            self._embeds[key] = (_numpy(t_emb), _numpy(t_mod))
        return self._embeds[key]

    def _cached_pass(self, x: torch.Tensor, t: torch.Tensor, prompt, cache: KVCache, start_frame: int) -> torch.Tensor:
        cfg = self.dit.config
        if x.shape[1] != cfg.in_dim:
            raise AlayaError(f"DiT input has shape {tuple(x.shape)}, expected (batch, {cfg.in_dim}, frames, height, width)")
        b, _, frames, height, width = x.shape
        pt, ph, pw = cfg.patch_size
        if frames % pt or height % ph or width % pw:
            raise AlayaError(f"DiT input {frames}x{height}x{width} (frames x height x width) is not divisible by the patch {cfg.patch_size}")
        if t.ndim == 0:
            t = t.expand(b)
        f, h, w = frames // pt, height // ph, width // pw
        tpf = h * w
        first = cache.begin(start_frame, f, tokens_per_frame=tpf, batch=b)
        end = cache.frames * tpf
        start = end - f * tpf
        past = (cache.capacity_frames - f) * tpf  # the cache's tokens before a chunk in the last slot
        rope = rope_freqs(first, f, h, w, cfg.head_dim, cfg.rope_theta, "cpu")
        text = self._text(prompt)
        t_emb, t_mod = self._embed(t)
        feed = {"x": _numpy(x), "t_emb": t_emb, "t_mod": t_mod, **text,
                "rope_cos": rope.real.contiguous().numpy(), "rope_sin": rope.imag.contiguous().numpy()}
        if past:
            if cache.rope == "relative":  # keys stored raw, rotated at their slots (kept between passes)
                key_rope = rope_freqs(0, cache.frames, h, w, cfg.head_dim, cfg.rope_theta, "cpu")
                for layer in range(cfg.num_layers):
                    cache.rotated_keys(layer, lambda keys, s: apply_rope(keys, key_rope[s:s + keys.shape[2]]))
                keys = cache.k_rotated
            else:
                keys = cache.k
            # the held tokens before the chunk, then zeros (masked): the chunk's own slot and the empty
            # slots (whose rotated-key memory was never written) are left out, the chunk's keys come as its own
            past_k, past_v = self._past_buffers(keys.shape[:3] + (past, keys.shape[4]))
            past_k[:, :, :, :start] = keys[:, :, :, :start].numpy()
            past_v[:, :, :, :start] = cache.v[:, :, :, :start].numpy()
            bias = np.zeros(past, dtype=np.float32)
            bias[start:] = -np.inf
            feed.update(past_k=past_k, past_v=past_v, past_bias=bias)
        compiled = self._compiled(feed, single_token="text_a" not in text, has_past=bool(past),
                                  rotated_keys=cache.rope == "absolute")
        with compiled.borrow() as request:
            outputs = request.infer(feed)
            velocity, k, v = (torch.from_numpy(outputs[i]) for i in range(3))
            cache.k[:, :, :, start:end] = k
            cache.v[:, :, :, start:end] = v
            return velocity.clone()

    def _past_buffers(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Zeroed arrays for the past keys and values (fresh each pass: the runtime copies its inputs)."""
        return np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=np.float32)

    def _compiled(self, feed: dict[str, np.ndarray], **variant):
        names = graphs.DiTStep(self.dit, **variant).input_names
        example = {n: torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names}

        def graph():
            return graphs.DiTStep(copy.deepcopy(self.dit).float(), **variant)

        tag = ",".join(f"{k}={v}" for k, v in sorted(variant.items()))
        return self.compiler.get(f"step[{tag}]", graph, example)
