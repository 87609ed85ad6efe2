"""FP8 and MXFP4 encode/decode on fresh random data, every code and extreme scales."""

import pytest
import torch

from ostinato.checkpoint.formats import (
    FP4_VALUES,
    dequantize_fp8,
    dequantize_mxfp4,
    e8m0_to_float,
    pack_fp4_codes,
    quantize_fp8,
    quantize_mxfp4,
    unpack_fp4_codes,
)


def _e8m0(values):
    return torch.tensor(values, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def test_e8m0_is_a_power_of_two_with_bias_127():
    decoded = e8m0_to_float(_e8m0([0, 1, 126, 127, 128, 254, 255]))
    expected = torch.tensor([2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127, float("nan")])
    torch.testing.assert_close(decoded, expected, equal_nan=True, rtol=0, atol=0)
    # agrees with torch's own e8m0 conversion
    assert torch.equal(decoded[:6], _e8m0([0, 1, 126, 127, 128, 254]).float())


@pytest.mark.parametrize("seed", range(4))
def test_fp8_round_trip_is_stable_and_close(seed):
    torch.manual_seed(seed)
    w = torch.randn(256, 384) * torch.logspace(-3, 3, 384)  # columns with very different ranges
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu and s.shape == (2, 3)
    d = dequantize_fp8(q, s)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 per element, up to the block's subnormal floor
    block_max = w.abs().reshape(2, 128, 3, 128).amax(dim=(1, 3)).repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert ((d - w).abs() <= w.abs() * 2**-4 + block_max * 2**-16).all()
    # decoded values are representable: re-encoding them loses nothing (the scale may get finer by one
    # power of two when rounding lowered a block's maximum, which only makes room)
    assert torch.equal(dequantize_fp8(*quantize_fp8(d)), d)


def test_fp8_decode_matches_the_definition_elementwise():
    q = (torch.randn(128, 256) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = _e8m0([[120, 135]])
    d = dequantize_fp8(q, s)
    assert torch.equal(d[:, :128], q[:, :128].float() * 2.0**-7)
    assert torch.equal(d[:, 128:], q[:, 128:].float() * 2.0**8)
    assert torch.equal(dequantize_fp8(q, s, torch.bfloat16).float(), d)  # exact in bf16 too


def test_fp4_nibble_order_low_first():
    packed = torch.tensor([[0x21, 0xF8]], dtype=torch.uint8).view(torch.int8)
    assert unpack_fp4_codes(packed).tolist() == [[1, 2, 8, 15]]
    assert torch.equal(pack_fp4_codes(unpack_fp4_codes(packed)), packed)


def test_mxfp4_every_code_and_extreme_scales():
    codes = torch.arange(16, dtype=torch.uint8).repeat(4, 4)  # [4, 64]: every code in every group
    packed = pack_fp4_codes(codes)
    scale = _e8m0([[1, 254], [127, 127], [100, 150], [0, 253]])  # includes 2^-127 and 2^127
    d = dequantize_mxfp4(packed, scale)
    lut = torch.tensor(FP4_VALUES)
    expected = lut[codes.long()] * e8m0_to_float(scale).repeat_interleave(32, dim=1)
    assert torch.equal(d, expected)
    assert torch.equal(torch.signbit(d[1, 8:9]), torch.tensor([True]))  # code 8 is -0


@pytest.mark.parametrize("seed", range(4))
def test_mxfp4_round_trip_on_random_data(seed):
    torch.manual_seed(seed)
    w = torch.randn(64, 256) * torch.logspace(-4, 4, 64)[:, None]
    packed, scale = quantize_mxfp4(w)
    assert packed.dtype == torch.int8 and packed.shape == (64, 128) and scale.shape == (64, 8)
    d = dequantize_mxfp4(packed, scale)
    # scale s = 2^ceil(log2(amax/6)) < amax/3; the widest e2m1 gap (4 -> 6) is 2s, so |error| <= s
    group_max = w.abs().reshape(64, 8, 32).amax(-1).repeat_interleave(32, 1)
    assert ((d - w).abs() <= group_max / 3).all()
    p2, s2 = quantize_mxfp4(d)
    assert torch.equal(dequantize_mxfp4(p2, s2), d)


def test_mxfp4_picks_the_nearest_code():
    x = torch.tensor([[0.2, 0.3, 0.74, 0.76, 1.24, 1.3, 2.4, 2.6, 3.6, 5.1, -5.1, -0.2] + [6.0] * 20])
    packed, scale = quantize_mxfp4(x)
    assert e8m0_to_float(scale).item() == 1.0
    d = dequantize_mxfp4(packed, scale)[0, :12]
    assert d.tolist() == [0.0, 0.5, 0.5, 1.0, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -6.0, -0.0]


def test_codecs_work_on_the_inputs_device():
    """The meta device stands in for CUDA here: a lookup table or constant made on the CPU and combined
    with the input (`--hot-backend torch` on a GPU dequantizes CUDA codes) raises a device mismatch."""
    packed = torch.zeros(4, 16, dtype=torch.int8, device="meta")
    scale = torch.zeros(4, 1, dtype=torch.uint8, device="meta").view(torch.float8_e8m0fnu)
    assert dequantize_mxfp4(packed, scale).device.type == "meta"
    q, s = quantize_mxfp4(torch.zeros(4, 32, device="meta"))
    assert q.device.type == "meta" and s.device.type == "meta"
    q8 = torch.zeros(128, 128, device="meta").to(torch.float8_e4m3fn)
    assert dequantize_fp8(q8, torch.zeros(1, 1, dtype=torch.uint8, device="meta")).device.type == "meta"
