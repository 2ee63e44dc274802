"""Five-branch G-buffer encoder: grouped == five separate TAEHV encoders, parallel == streaming."""
import numpy as np
import pytest
import torch
from torch import nn

from alaya_flash.model_zoo import latents, loading, registry
from alaya_flash.model_zoo.codecs.gbuffer_encoder import (
    GBufferEncoder,
    GBufferEncoderConfig,
    GBufferEncoderStream,
    join_branches,
    split_branches,
)
from alaya_flash.model_zoo.codecs.tiny import TinyCodecConfig, build_encoder, run_causal
from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.gbuffer import MODALITIES, teacher_to_model

MICRO = GBufferEncoderConfig(hidden=8)


def micro_encoder() -> GBufferEncoder:
    torch.manual_seed(0)
    return GBufferEncoder(MICRO).eval()


def teacher_frames(t: int, h: int = 16, w: int = 24, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, size=(1, t, 5, h, w, 3), dtype=np.uint8))


def test_branches_follow_the_modality_order_and_80_channels():
    assert MICRO.branches == len(MODALITIES) and MICRO.out_channels == 80
    z = micro_encoder().encode(teacher_frames(9))
    assert z.shape == (1, 80, latents.latent_frames(9), 2, 3) == (1, 80, 3, 2, 3)


def test_grouped_equals_five_separate_taehv_encoders():
    enc = micro_encoder()
    images = teacher_frames(9)
    z = enc.encode(images)
    x = teacher_to_model(images.numpy())  # (1, T, 5, H, W, 3) in [-1, 1]
    for g, sd in enumerate(split_branches(enc.state_dict())):
        holder = nn.Module()
        holder.encoder = build_encoder(TinyCodecConfig(encoder_width=MICRO.hidden))
        loading.load_strict(holder, sd)
        frames = x[:, :, g].permute(0, 1, 4, 2, 3)  # (1, T, 3, H, W)
        frames = torch.cat([frames[:, :1]] * 3 + [frames], 1)  # Wan alignment: frame 0 alone
        with torch.no_grad():
            ref = run_causal(holder.encoder, frames, {}).permute(0, 2, 1, 3, 4)
        assert (z[:, 16 * g : 16 * g + 16] - ref).abs().max() <= 1e-5, MODALITIES[g]
    assert torch.equal(join_branches(split_branches(enc.state_dict()))["encoder.4.conv.0.weight"],
                       enc.state_dict()["encoder.4.conv.0.weight"])


def test_inference_stacks_equal_the_grouped_training_stack():
    """encode() runs five ungrouped stacks; training runs the grouped one (enc.encoder)."""
    enc = micro_encoder()
    images = teacher_frames(9)
    x = enc.to_input(images)
    x = torch.cat([x[:, :1].expand(-1, 3, -1, -1, -1), x], 1)
    with torch.no_grad():
        grouped = run_causal(enc.encoder, x, {}).permute(0, 2, 1, 3, 4)
    assert (enc.encode(images) - grouped).abs().max() <= 1e-5


def test_bf16_streams_through_five_stacks_that_match_the_grouped_float32_one():
    enc = micro_encoder()
    images = teacher_frames(9)
    ref = enc.encode(images)  # float32: the grouped stack
    stream = GBufferEncoderStream(enc)
    assert len(stream.stacks) == 1
    enc.to(torch.bfloat16)  # after the stream was made, before it started: it follows
    z = torch.cat([z for t in range(5) if (z := stream.encode(images[:, t:t + 1])) is not None], 2)
    assert len(stream.stacks) == 5 and z.dtype == torch.bfloat16
    assert (z.float() - ref[:, :, :2]).abs().max() <= 0.05 * ref.abs().max()
    enc.float()  # moved mid-stream: refused, not silently mixed
    with pytest.raises(AlayaError, match="mid-stream"):
        stream.encode(images[:, 5:6])


def test_streaming_equals_parallel_frame_by_frame():
    enc = micro_encoder()
    images = teacher_frames(13)
    whole = enc.encode(images)
    stream, got = GBufferEncoderStream(enc), []
    for t in range(images.shape[1]):
        out = stream.encode(images[0, t])
        assert (out is not None) == (t % 4 == 0)
        got.append(out)
    assert (torch.cat([g for g in got if g is not None], 2) - whole).abs().max() <= 1e-5
    stream.reset()  # and in uneven chunks of float [-1, 1] input
    x = teacher_to_model(images.numpy())
    chunks = [stream.encode(x[:, a:b]) for a, b in ((0, 2), (2, 7), (7, 13))]
    assert (torch.cat([c for c in chunks if c is not None], 2) - whole).abs().max() <= 1e-5


def test_stream_memory_is_flat():
    stream = GBufferEncoderStream(micro_encoder())
    frame = teacher_frames(1, 8, 8)[0, 0]
    shapes = []
    for step in range(1, 42):
        stream.encode(frame)
        if step in (5, 41):  # same phase of the 4-frame cycle
            shapes.append(stream.state_shapes())
    assert shapes[0] == shapes[1] and len(shapes[0]) >= 9


def test_registry_and_bad_inputs():
    module = registry.build("gbuffer-encoder", device="meta")
    lines = loading.spec_lines(module)
    assert "encoder.0.weight 640x3x3x3" in lines and "encoder.17.weight 80x128x3x3" in lines
    enc = micro_encoder()
    with pytest.raises(AlayaError, match=r"teacher form \(B, T, 5, H, W, 3\)"):
        enc.encode(torch.zeros(1, 4, 4, 16, 16, 3, dtype=torch.uint8))
    with pytest.raises(AlayaError, match="multiple of 8"):
        enc.encode(torch.zeros(1, 4, 5, 12, 16, 3, dtype=torch.uint8))
