"""Convolutions with their ReLU and residual add fused (and the DiT's linear + GELU), for
reduced-precision inference on the CPU.

The small codecs (model_zoo/codecs: G-buffer encoder, tiny decoder, refiner) are mostly narrow 3x3 convolutions, each
followed by a ReLU and, in MemBlocks, a residual add. In bf16 on the CPU the separate element-wise
passes cost as much as the convolutions: profiling the default G-buffer encoder at 256x256 (one
thread) gave convolutions 44% of the time, ReLU 21%, adds 11% (docs/benchmarks.md). oneDNN applies
a ReLU and an add as post-ops of the convolution itself, while the output is still in cache;
PyTorch exposes that as `torch.ops.mkldnn._convolution_pointwise` (what torch.compile lowers such
patterns to on the CPU).

Only bf16/fp16 without autograd takes the fused path. float32 keeps separate ops, so its results
stay independent of how frames are batched (chunked streams equal whole clips bit for bit). The
fused ReLU gives the same bits as the separate one; a fused add rounds once instead of twice
(within one bf16 step of the separate ops). Where the op is missing (another PyTorch build, or a
device other than the CPU), or this CPU has no oneDNN kernel for the dtype (fp16 needs AVX512-FP16
or AVX-NE-CONVERT: an AMD EPYC with AVX512-BF16 refuses it), everything falls back to the separate ops.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

REDUCED_PRECISION = (torch.bfloat16, torch.float16)


def _has_fused_op() -> bool:
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


FUSED_OP = _has_fused_op()


@functools.lru_cache(maxsize=None)
def fused_op_runs(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN runs the fused ops in `dtype`: tried once on tiny inputs, since the
    kernels depend on the CPU's instructions, not on the PyTorch build (fp16 fails on CPUs without
    AVX512-FP16 / AVX-NE-CONVERT, with an error, not a slow path)."""
    x = torch.ones(1, 4, 3, 3, dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = torch.ones(4, 4, 3, 3, dtype=dtype)
    args = (w, None, [1, 1], [1, 1], [1, 1], 1)
    try:
        with torch.no_grad():
            torch.ops.mkldnn._convolution_pointwise(x, *args, "relu", [], "")
            torch.ops.mkldnn._convolution_pointwise.binary(x, x.clone(), *args, "add", 1.0, "relu", [], None)
            torch.ops.mkldnn._linear_pointwise(torch.ones(3, 4, dtype=dtype), w[:, :, 0, 0], None, "gelu", [], "tanh")
    except (AttributeError, RuntimeError):  # (AttributeError: a build without the ops)
        return False
    return True


def fusable(x: Tensor) -> bool:
    """Whether convolutions over x take the fused oneDNN path: CPU, bf16/fp16 where this CPU's oneDNN
    has kernels for it, no autograd."""
    return (FUSED_OP and x.device.type == "cpu" and x.dtype in REDUCED_PRECISION
            and not (torch.is_grad_enabled() and x.requires_grad) and fused_op_runs(x.dtype))


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, groups: int = 1,
           relu: bool = False, add: Tensor | None = None) -> Tensor:
    """relu(conv2d(x, weight, bias) + add), the ReLU and the add optional, fused where `fusable`."""
    if fusable(x) and weight.dtype == x.dtype and not (torch.is_grad_enabled() and weight.requires_grad):
        pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
        args = (weight, bias, pair(padding), pair(stride), [1, 1], groups)
        if add is None:
            return torch.ops.mkldnn._convolution_pointwise(x, *args, "relu" if relu else "none", [], "")
        if x.is_contiguous(memory_format=torch.channels_last):  # (oneDNN's binary post-op wants NHWC)
            x, add = _nhwc(x), _nhwc(add.to(x.dtype).contiguous(memory_format=torch.channels_last))
            return torch.ops.mkldnn._convolution_pointwise.binary(x, add, *args, "add", 1.0,
                                                                  "relu" if relu else None, [], None)
    y = F.conv2d(x, weight, bias, stride, padding, 1, groups)
    if add is not None:
        y = y + add
    return torch.relu(y) if relu else y


def _nhwc(x: Tensor) -> Tensor:
    """A channels-last contiguous x with the canonical NHWC strides. A one-frame view can carry any
    stride on its batch dimension (it is never used), but oneDNN reads the strides to pick the
    layout and would otherwise take a path that has no bf16 kernel."""
    n, c, h, w = x.shape
    strides = (c * h * w, 1, w * c, c)
    return x if x.stride() == strides else x.as_strided(x.shape, strides)


def conv(layer: nn.Conv2d, x: Tensor, relu: bool = False, add: Tensor | None = None) -> Tensor:
    """A Conv2d layer (zero padding) applied as `conv2d`."""
    if layer.padding_mode != "zeros" or isinstance(layer.padding, str) or tuple(layer.dilation) != (1, 1):
        y = layer(x) if add is None else layer(x) + add
        return torch.relu(y) if relu else y
    return conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.groups, relu, add)


def sequential(layers: nn.Sequential, x: Tensor) -> Tensor:
    """Run a Sequential, each Conv2d that a ReLU follows fused with it."""
    modules = list(layers)
    i = 0
    while i < len(modules):
        m = modules[i]
        if isinstance(m, nn.Conv2d) and i + 1 < len(modules) and isinstance(modules[i + 1], nn.ReLU):
            x = conv(m, x, relu=True)
            i += 2
        else:
            x = m(x)
            i += 1
    return x


def linear_gelu(x: Tensor, layer: nn.Linear) -> Tensor:
    """gelu(linear(x)) with the tanh approximation (the DiT's FFN), fused where `fusable`: PyTorch's
    separate bf16 tanh-GELU is slow on the CPU (328 us against 72 us for the linear before it, a
    DiT FFN at 256 tokens, one thread)."""
    if fusable(x) and x.dtype == layer.weight.dtype and not (torch.is_grad_enabled() and layer.weight.requires_grad):
        return torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "gelu", [], "tanh")
    return F.gelu(F.linear(x, layer.weight, layer.bias), approximate="tanh")
