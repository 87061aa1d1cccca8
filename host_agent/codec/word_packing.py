"""Lossless packing of int32 words for a collective that moves bytes: each block of ``BLOCK_WORDS`` words
in as many bits per word as the block's widest needs.

Why: a dense bucket's words are its gradient quantized so that W workers' sum fits int32, so a typical
word uses 20 to 26 of its 32 bits (VGG19 and BERT-base in training: 68-79% of the bytes packed). The
process group's long sums may move packed words (``host_agent.long_sum``); the switch adds words as they
are and never sees this layout.

Layout of ``n`` words (``pack``'s output, ``unpack``'s input), all little-endian bytes:

- one width byte per block of ``BLOCK_WORDS`` words (the last block padded with zeros), 0 to 32;
- zero bytes up to a multiple of 4 (``_payload_offset``);
- each block's payload in order: its ``BLOCK_WORDS`` zigzag values (``zigzag``), value j in bits
  ``j * width`` to ``(j + 1) * width - 1`` of the payload, bit k of the payload bit k % 8 of its byte
  k // 8: ``4 * width`` bytes, so every payload starts on a whole word.

The torch code here is the reference; the CPU kernels (``cpu/kernels_pack.c``) write the same bytes.
"""

from __future__ import annotations

import torch

from host_agent.errors import AggregationError

from .arith import wrap_int32
from .cpu import native

#: Words per block (``PACK_BLOCK_WORDS`` in cpu/kernels.h): 32 zigzag values of width w fill w whole words.
BLOCK_WORDS = 32
#: Blocks the torch code widens to bits at a time (32 x 32 bytes each).
_CHUNK_BLOCKS = 4096


def capacity(n: int) -> int:
    """The most bytes ``pack`` may write for ``n`` words (every block at full width)."""
    blocks = _blocks(n)
    return _payload_offset(blocks) + blocks * BLOCK_WORDS * 4


def pack(words: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``words`` (1-D int32, on the CPU) packed: a uint8 view of ``out`` (or a new tensor) holding the
    layout of the module docstring."""
    _check_words(words)
    if out is None:
        out = torch.empty(capacity(words.numel()), dtype=torch.uint8)
    if not _is_bytes(out) or out.numel() < capacity(words.numel()):
        raise ValueError(f"pack needs a contiguous 1-D uint8 CPU buffer of {capacity(words.numel())} bytes")
    if native is not None:
        size = native.pack(words.data_ptr(), words.numel(), out.data_ptr(), out.numel())
        return out[:size]
    return _pack_torch(words, out)


def unpack(packed: torch.Tensor, n: int, out: torch.Tensor | None = None, *,
           add: bool = False) -> torch.Tensor:
    """The ``n`` words ``packed`` holds, written to ``out`` (or a new tensor), or added to it mod 2^32
    where ``add``. A buffer whose size disagrees with its block widths for ``n`` words, or with a width
    over 32, raises AggregationError naming the problem, and ``out`` is left as it was (the padding bytes
    and the last block's padding values are not checked: they change no word)."""
    if not _is_bytes(packed):
        raise ValueError("unpack takes a contiguous 1-D uint8 CPU tensor")
    if out is None:
        out = torch.zeros(n, dtype=torch.int32)
        add = False
    _check_words(out)
    if out.numel() != n:
        raise ValueError(f"unpack of {n} words into {out.numel()}")
    if native is not None:
        if not native.unpack(packed.data_ptr(), packed.numel(), n, out.data_ptr(), add):
            raise _malformed(packed, n)
        return out
    if _layout_problem(packed, n):
        raise _malformed(packed, n)
    values = _unpack_torch(packed, n)
    if add:
        out.copy_(wrap_int32(out.to(torch.int64) + values))
    else:
        out.copy_(values.to(torch.int32))
    return out


def zigzag(words: torch.Tensor) -> torch.Tensor:
    """int32 words as unsigned values in int64: 0, -1, 1, -2, ... to 0, 1, 2, 3, ..."""
    wide = words.to(torch.int64)
    return ((wide << 1) ^ (wide >> 31)) & 0xFFFFFFFF


def unzigzag(values: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`zigzag` (int64 values below 2^32 to int64 in the int32 range)."""
    return (values >> 1) ^ -(values & 1)


def _blocks(n: int) -> int:
    return -(-n // BLOCK_WORDS)


def _payload_offset(blocks: int) -> int:
    return -(-blocks // 4) * 4


def _malformed(packed: torch.Tensor, n: int) -> AggregationError:
    return AggregationError(f"a packed message of {packed.numel()} bytes does not hold {n} words: "
                            f"{_layout_problem(packed, n)}")


def _is_bytes(buffer: torch.Tensor) -> bool:
    cpu_bytes = buffer.dtype == torch.uint8 and buffer.device.type == "cpu"
    return cpu_bytes and buffer.dim() == 1 and buffer.is_contiguous()


def _check_words(words: torch.Tensor) -> None:
    cpu_words = words.dtype == torch.int32 and words.device.type == "cpu"
    if not cpu_words or words.dim() != 1 or not words.is_contiguous():
        raise ValueError("word packing takes contiguous 1-D int32 CPU tensors")


def _widths(values: torch.Tensor) -> torch.Tensor:
    """Bits each row of ``values`` (int64, below 2^32) needs: the bit length of its largest."""
    largest = values.max(dim=1).values
    return torch.frexp(largest.to(torch.float64)).exponent.to(torch.int64)  # exact below 2^53; 0 for 0


def _pack_torch(words: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    blocks = _blocks(words.numel())
    values = zigzag(words)
    values = torch.nn.functional.pad(values, (0, blocks * BLOCK_WORDS - words.numel()))
    values = values.view(blocks, BLOCK_WORDS)
    widths = _widths(values) if blocks else torch.zeros(0, dtype=torch.int64)
    offset = _payload_offset(blocks)
    out[:offset] = 0
    out[:blocks] = widths.to(torch.uint8)
    bit = torch.arange(32)
    for first in range(0, blocks, _CHUNK_BLOCKS):
        chunk, width = values[first:first + _CHUNK_BLOCKS], widths[first:first + _CHUNK_BLOCKS]
        bits = ((chunk.unsqueeze(-1) >> bit) & 1).to(torch.uint8)  # (blocks, value, bit)
        stream = bits[(bit < width.view(-1, 1, 1)).expand_as(bits)].view(-1, 8)  # block, value, bit order
        payload = (stream.to(torch.int32) << torch.arange(8, dtype=torch.int32)).sum(1).to(torch.uint8)
        out[offset:offset + payload.numel()] = payload
        offset += payload.numel()
    return out[:offset]


def _layout_problem(packed: torch.Tensor, n: int) -> str:
    """What keeps ``packed`` from holding ``n`` words, or "" when nothing does."""
    blocks = _blocks(n)
    if packed.numel() < _payload_offset(blocks):
        return f"its {blocks} block widths alone need {_payload_offset(blocks)} bytes"
    widths = packed[:blocks].to(torch.int64)
    if blocks and int(widths.max()) > 32:
        return f"a block width of {int(widths.max())} bits (at most 32)"
    expected = _payload_offset(blocks) + 4 * int(widths.sum())
    if expected != packed.numel():
        return f"its block widths make {expected} bytes"
    return ""


def _unpack_torch(packed: torch.Tensor, n: int) -> torch.Tensor:
    blocks = _blocks(n)
    widths = packed[:blocks].to(torch.int64)
    offset = _payload_offset(blocks)
    bit = torch.arange(32)
    parts = []
    for first in range(0, blocks, _CHUNK_BLOCKS):
        width = widths[first:first + _CHUNK_BLOCKS]
        size = 4 * int(width.sum())
        payload = packed[offset:offset + size].to(torch.int64)
        offset += size
        stream = ((payload.unsqueeze(-1) >> torch.arange(8)) & 1).view(-1)
        bits = torch.zeros(width.numel(), BLOCK_WORDS, 32, dtype=torch.int64)
        bits[(bit < width.view(-1, 1, 1)).expand_as(bits)] = stream
        parts.append(unzigzag((bits << bit).sum(-1)).view(-1))
    return torch.cat(parts)[:n] if parts else torch.zeros(0, dtype=torch.int64)

