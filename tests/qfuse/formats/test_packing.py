"""int32 word packing against compressed-tensors' own packer, and the AutoAWQ interleave."""

import pytest
import torch

from qfuse.formats.packing import AWQ_ORDER, AWQ_REVERSE, awq_pack, awq_unpack, pack_int32, unpack_int32
from qfuse.ops.int4_packing import pack_int4

ct_helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dim", [0, 1])
def test_round_trip(bits, dim):
    shape = (5, 96) if dim == 1 else (96, 5)
    codes = torch.randint(0, 2**bits, shape, dtype=torch.uint8)
    words = pack_int32(codes, bits, dim)
    assert words.dtype == torch.int32 and words.shape[dim] == 96 * bits // 32
    assert torch.equal(unpack_int32(words, bits, dim), codes)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("packed_dim", [0, 1])
def test_matches_compressed_tensors(bits, packed_dim):
    """compressed-tensors packs signed int8 values as value + 2**(bits-1), element i of the
    packed dimension at bit bits*i of the row's bit stream."""
    signed = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (24, 64), dtype=torch.int8)
    theirs = ct_helpers.pack_to_int32(signed, bits, packed_dim=packed_dim)
    unsigned = (signed.to(torch.int16) + 2 ** (bits - 1)).to(torch.uint8)
    assert torch.equal(pack_int32(unsigned, bits, packed_dim), theirs)
    back = ct_helpers.unpack_from_int32(theirs, bits, signed.shape, packed_dim=packed_dim)
    assert torch.equal(unpack_int32(theirs, bits, packed_dim).to(torch.int16) - 2 ** (bits - 1), back.to(torch.int16))


def test_four_bit_words_hold_qfuse_bytes():
    """A compressed-tensors 4-bit weight_packed row is qfuse's int4 byte layout, bit for bit."""
    codes = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
    assert torch.equal(pack_int32(codes, 4).view(torch.uint8), pack_int4(codes))


def test_awq_interleave():
    """AutoAWQ: nibble i of a word holds logical column AWQ_ORDER[i] (written out by hand)."""
    codes = torch.randint(0, 16, (3, 16), dtype=torch.uint8)
    words = awq_pack(codes)
    for c in range(2):
        for i in range(8):
            nibble = (words[:, c].to(torch.int64) >> (4 * i)) & 15
            assert torch.equal(nibble, codes[:, 8 * c + AWQ_ORDER[i]].to(torch.int64))
    assert torch.equal(awq_unpack(words), codes)
    assert all(AWQ_ORDER[AWQ_REVERSE[j]] == j for j in range(8))


def test_rejects_what_does_not_pack():
    with pytest.raises(ValueError, match="only 2, 4 and 8"):
        pack_int32(torch.zeros(2, 32, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="whole int32 words"):
        pack_int32(torch.zeros(2, 12, dtype=torch.uint8), 4)
    with pytest.raises(TypeError, match="int32"):
        unpack_int32(torch.zeros(2, 4, dtype=torch.int64), 4)
