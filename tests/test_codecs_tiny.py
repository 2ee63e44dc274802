"""Tiny codec (TAEHV layout): exact taew2_1 keys, parallel == chunked == streaming, bounded memory."""
from pathlib import Path

import pytest
import torch

from alaya_flash.model_zoo import latents, loading, registry
from alaya_flash.model_zoo.codecs.tiny import TinyCodec, TinyCodecConfig, TinyStream
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError

DATA = Path(__file__).parent / "data"
MICRO = TinyCodecConfig(encoder_width=8, decoder_widths=(16, 8, 8, 8))


def micro_codec() -> TinyCodec:
    torch.manual_seed(0)
    codec = TinyCodec(MICRO).eval()
    with torch.no_grad():  # centre the output so frames are not clamped flat at 0 or 1
        codec.decoder[-1].bias.fill_(0.5)
    return codec


def key_file_lines(name: str) -> list[str]:
    return [ln.strip() for ln in (DATA / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_taew2_1_spec_matches_shared_key_file():
    module = registry.build("taew2_1", device="meta")
    assert loading.spec_lines(module) == key_file_lines("taew2_1.keys.txt")
    assert sum(p.numel() for p in module.parameters()) == 11_315_539


def test_decode_parallel_equals_chunked_and_streaming():
    codec = micro_codec()
    z = torch.randn(2, 16, 6, 3, 4)
    whole = codec.decode(z)
    assert whole.shape == (2, latents.pixel_frames(6), 3, 24, 32)
    assert 0.0 < whole.mean() < 1.0 and whole[:, 1:].sub(whole[:, :-1]).abs().max() > 1e-3
    for chunk in (1, 2, 4):
        assert torch.allclose(codec.decode(z, chunk=chunk), whole, atol=1e-5, rtol=0)
    stream, got = TinyStream(codec), []
    for t in range(z.shape[2]):
        out = stream.decode(z[:, :, t])
        assert out is not None and out.shape[1] == (1 if t == 0 else 4)
        got.append(out)
    assert stream.flush() is None
    assert (torch.cat(got, 1) - whole).abs().max() <= 1e-5


def test_21_latents_give_81_frames():
    frames = micro_codec().decode(torch.randn(1, 16, 21, 1, 1))
    assert frames.shape[1] == 81 == latents.pixel_frames(21)
    assert frames.min() >= 0 and frames.max() <= 1


def test_encode_parallel_equals_streaming_with_end_padding():
    codec = micro_codec()
    x = torch.rand(1, 10, 3, 16, 24)  # 10 frames -> padded to 12 -> 3 latents
    whole = codec.encode(x)
    assert whole.shape == (1, 16, 3, 2, 3) == (1, 16, latents.latent_frames(10), 2, 3)
    padded = torch.cat([x, x[:, -1:], x[:, -1:]], 1)
    assert torch.allclose(codec.encode(padded), whole, atol=1e-6, rtol=0)
    stream, got = TinyStream(codec), []
    for t in range(x.shape[1]):
        out = stream.encode(x[:, t])
        assert (out is not None) == (t % 4 == 3)
        got.append(out)
    got.append(stream.flush())
    assert (torch.cat([g for g in got if g is not None], 2) - whole).abs().max() <= 1e-5


def test_stream_memory_is_flat():
    codec = micro_codec()
    stream = TinyStream(codec)
    z = torch.randn(1, 16, 1, 1)
    frame = torch.rand(1, 3, 8, 8)
    shapes = []
    for step in range(1, 51):
        stream.decode(z)
        for _ in range(4):
            stream.encode(frame)
        if step in (2, 50):
            shapes.append(stream.state_shapes())
    assert shapes[0] == shapes[1] and len(shapes[0]) > 9


def test_reset_starts_a_new_stream():
    codec = micro_codec()
    z = torch.randn(1, 16, 3, 2, 2)
    stream = TinyStream(codec)
    first = stream.decode(z)
    stream.reset()
    assert torch.equal(stream.decode(z), first)


def test_weights_round_trip_strictly(tmp_path):
    codec = micro_codec()
    path = loading.save_safetensors(codec.state_dict(), tmp_path / "micro.safetensors")
    other = loading.load_strict(TinyCodec(MICRO), path)
    z = torch.randn(1, 16, 2, 2, 2)
    assert torch.equal(other.decode(z), codec.decode(z))
    state = codec.state_dict()
    state["decoder.7.conv.weight"] = state["decoder.7.conv.weight"][:8]
    with pytest.raises(CheckpointError, match=r"decoder\.7\.conv\.weight is 8x16x1x1, expected 16x16x1x1"):
        loading.load_strict(TinyCodec(MICRO), state)


def test_bad_inputs_are_named():
    codec = micro_codec()
    with pytest.raises(AlayaError, match="16 channels on dim 1"):
        codec.decode(torch.randn(1, 4, 2, 2, 2))
    with pytest.raises(AlayaError, match="multiple of 8"):
        TinyStream(codec).encode(torch.rand(1, 3, 12, 16))


def test_latent_normalization_and_frame_arithmetic():
    z = torch.randn(2, 16, 3, 4, 4)
    assert torch.allclose(latents.denormalize(latents.normalize(z)), z, atol=1e-5)
    mean = torch.tensor(latents.WAN21_LATENT_MEAN).view(1, 16, 1, 1, 1).expand(1, 16, 2, 1, 1)
    assert latents.normalize(mean).abs().max() < 1e-6  # the mean maps to 0
    assert latents.normalize(z.movedim(1, -1), dim=-1).movedim(-1, 1).allclose(latents.normalize(z))
    assert [latents.latent_frames(t) for t in (1, 4, 5, 16, 81)] == [1, 1, 2, 4, 21]
    assert [latents.pixel_frames(t) for t in (1, 2, 21)] == [1, 5, 81]
    with pytest.raises(AlayaError, match="8 channels on dim 1, expected 16"):
        latents.normalize(torch.zeros(1, 8, 1, 1, 1))


def test_cli_model_spec_lists_the_shared_key_file(capsys):
    from alaya_flash.streaming.cli import main

    assert main(["model", "spec", "taew2_1"]) == 0
    assert capsys.readouterr().out.splitlines() == key_file_lines("taew2_1.keys.txt")


def test_bf16_channels_last_path_agrees_with_fp32():
    codec = micro_codec()
    z = torch.randn(1, 16, 3, 2, 2)
    ref = codec.decode(z)
    fast = TinyCodec(MICRO).to(torch.bfloat16)
    fast.load_state_dict(codec.state_dict())
    got = fast.decode(z, chunk=1).float()
    assert got.shape == ref.shape and (got - ref).abs().max() < 0.05


@pytest.mark.parametrize("groups", [1, 5])
def test_bf16_streaming_layers_match_the_float32_fold_and_cat(groups):
    """bf16 inference pools frame by frame (a sum of per-frame 1x1 convs) and builds MemBlock inputs
    channels-last; in any chunking that must equal float32's fold-and-cat path up to bf16 rounding."""
    from alaya_flash.model_zoo.codecs.tiny import MemBlock, TPool

    torch.manual_seed(0)
    x = torch.randn(1, 7, groups * 4, 8, 8)
    for layer in (TPool(4, 2, groups), MemBlock(4, 4, groups)):
        ref, ref_state = layer.forward_seq(x, None)
        fast = layer.to(torch.bfloat16)
        for chunks in ((0, 1, 2, 3, 4, 5, 6, 7), (0, 3, 4, 7), (0, 7)):
            state, outs = None, []
            with torch.no_grad():
                for a, b in zip(chunks, chunks[1:]):
                    y, state = fast.forward_seq(x[:, a:b].bfloat16(), state)
                    outs.append(y)
            got = torch.cat(outs, 1).float()
            assert got.shape == ref.shape, (type(layer).__name__, chunks)
            assert (got - ref).abs().max() <= 0.03 * ref.abs().max(), (type(layer).__name__, chunks)
            assert torch.equal(state.float(), ref_state.bfloat16().float()), "the memory is the last frame(s)"
        layer.float()
