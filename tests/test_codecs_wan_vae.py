"""Wan2.1 VAE: Wan key names, strict reload, normalization and frame counts, chunked == whole clip."""
import pytest
import torch
import torch.nn.functional as F

from alaya_flash.model_zoo import latents, loading, registry
from alaya_flash.model_zoo.codecs.wan_vae import CONFIGS, WanVAE, tiled
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return WanVAE(CONFIGS["wan2.1-vae-small"]).eval()


def video(t, h=16, w=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 3, t, h, w, generator=g) * 2 - 1


def test_full_size_uses_wan_key_names():
    module = registry.build("wan2.1-vae", device="meta")
    assert sum(p.numel() for p in module.parameters()) == 126_892_531
    lines = set(loading.spec_lines(module))
    for line in [
        "conv1.weight 32x32x1x1x1", "conv2.weight 16x16x1x1x1",
        "encoder.conv1.weight 96x3x3x3x3",
        "encoder.downsamples.0.residual.0.gamma 96x1x1x1",
        "encoder.downsamples.0.residual.6.weight 96x96x3x3x3",
        "encoder.downsamples.3.shortcut.weight 192x96x1x1x1",
        "encoder.downsamples.2.resample.1.weight 96x96x3x3",
        "encoder.downsamples.5.time_conv.weight 192x192x3x1x1",
        "encoder.middle.1.norm.gamma 384x1x1", "encoder.middle.1.to_qkv.weight 1152x384x1x1",
        "encoder.head.2.weight 32x384x3x3x3",
        "decoder.conv1.weight 384x16x3x3x3",
        "decoder.upsamples.3.time_conv.weight 768x384x3x1x1",
        "decoder.upsamples.3.resample.1.weight 192x384x3x3",
        "decoder.upsamples.4.residual.2.weight 384x192x3x3x3",
        "decoder.head.0.gamma 96x1x1x1", "decoder.head.2.weight 3x96x3x3x3",
    ]:  # fmt: skip
        assert line in lines, line


def test_frame_counts_and_normalization(vae):
    x = video(9)
    z = vae.encode(x)
    assert z.shape == (1, 16, latents.latent_frames(9), 2, 3)
    raw = vae.conv1(vae.encoder(x, {}))[:, :16]  # mu before normalization
    assert torch.allclose(latents.denormalize(z), raw, atol=1e-5)
    assert torch.allclose(latents.normalize(latents.denormalize(z)), z, atol=1e-5)
    for extra in (1, 2, 3):  # frames after 4k+1 are not encoded, as in Wan
        assert torch.equal(vae.encode(torch.cat([x, video(extra, seed=7)], 2)), z)
    out = vae.decode(z)
    assert out.shape == (1, 3, latents.pixel_frames(3), 16, 24) and out.abs().max() <= 1
    ref = vae.decoder(vae.conv2(latents.denormalize(z)), {}).clamp(-1, 1)
    assert torch.allclose(out, ref, atol=1e-5)


def test_chunked_equals_whole_clip(vae):
    x = video(13)
    whole = vae.encode(x, chunk=None)
    for chunk in (1, 2, 4):
        assert (vae.encode(x, chunk=chunk) - whole).abs().max() <= 1e-5
    z = torch.randn(1, 16, 4, 2, 3)
    dec = vae.decode(z, chunk=None)
    assert dec.shape[2] == 13 and dec.std() > 0.01
    for chunk in (1, 3):
        assert (vae.decode(z, chunk=chunk) - dec).abs().max() <= 1e-5


def test_reload_strict_and_wrong_keys_named(vae, tmp_path):
    path = loading.save_safetensors(vae.state_dict(), tmp_path / "vae.safetensors")
    other = loading.load_strict(WanVAE(CONFIGS["wan2.1-vae-small"]), path)
    z = torch.randn(1, 16, 2, 2, 2)
    assert torch.equal(other.decode(z), vae.decode(z))
    bad = dict(vae.state_dict())
    bad["decoder.head.0.weight"] = bad.pop("decoder.head.0.gamma")
    bad["model.conv2.weight"] = bad.pop("conv2.weight")  # DiffSynth's prefix is not Wan's naming
    path = loading.save_safetensors(bad, tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError) as err:
        loading.load_strict(WanVAE(CONFIGS["wan2.1-vae-small"]), path)
    msg = str(err.value)
    assert "bad.safetensors" in msg and "2 missing (conv2.weight, decoder.head.0.gamma)" in msg
    assert "2 unexpected (decoder.head.0.weight, model.conv2.weight)" in msg


def test_tiling_blends_to_the_untiled_result():
    x = torch.randn(1, 4, 2, 40, 56)
    pool = lambda t: F.avg_pool3d(t, (1, 8, 8))  # noqa: E731  a pointwise-in-tiles stand-in
    assert torch.allclose(tiled(pool, x, (16, 24), (8, 16), 1 / 8), pool(x), atol=1e-6)
    up = lambda t: F.interpolate(t, scale_factor=(1, 8, 8))  # noqa: E731
    assert torch.allclose(tiled(up, x, (3, 4), (2, 3), 8), up(x), atol=1e-6)


def test_tiled_vae_whole_frame_tile_and_bad_input(vae):
    z = torch.randn(1, 16, 2, 2, 3)
    assert torch.allclose(vae.decode(z, tile=((2, 3), (1, 2))), vae.decode(z), atol=1e-6)
    tiled_out = vae.decode(torch.randn(1, 16, 2, 4, 6), tile=((2, 4), (1, 2)))
    assert tiled_out.shape == (1, 3, 5, 32, 48) and torch.isfinite(tiled_out).all()
    with pytest.raises(AlayaError, match="multiple of 8"):
        vae.encode(video(5, h=12))
    with pytest.raises(AlayaError, match=r"expected latents \(B, 16, T, h, w\)"):
        vae.decode(torch.randn(1, 8, 2, 2, 2))
