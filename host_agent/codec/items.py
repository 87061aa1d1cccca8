"""Items: groups of ``block`` consecutive elements, the unit the index and the sketch work on.

A bucket of n elements has ceil(n / block) items; the last one may be short and is then read and written
as if padded with zeros, without ever copying the bucket to pad it.
"""

from __future__ import annotations

import torch

from .bits import nonzero_positions
from .cpu import kernel_threads, native

_SCAN_DTYPES = (torch.float32, torch.int32)


def item_count(n: int, block: int) -> int:
    return (n + block - 1) // block


def nonzero_items(x: torch.Tensor, block: int) -> torch.Tensor:
    """Sorted item numbers (int64) of the items of ``x`` holding any nonzero (or NaN) element."""
    elements = nonzero_positions(x)
    if block == 1:
        return elements
    return torch.unique_consecutive(torch.div(elements, block, rounding_mode="floor"))


def count_nonzero_items(x: torch.Tensor, block: int) -> int:
    """How many items of ``x`` hold any nonzero (or NaN) element, as :func:`nonzero_items` finds them,
    without listing them: what a dense round tells mode ``auto`` of the bucket's density."""
    if block == 1:
        return int(torch.count_nonzero(x))
    flat = x.reshape(-1)
    flat = torch.nn.functional.pad(flat, (0, (-flat.numel()) % block))
    return int((flat.view(-1, block) != 0).any(1).sum())


def nonzero_rows(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`nonzero_items`, their (K, block) rows); for a 32-bit bucket on a CPU, both from one pass."""
    if x.device.type == "cpu" and native is not None and block == 1 and x.dtype in _SCAN_DTYPES:
        return scan_nonzero_native(x)
    items = nonzero_items(x, block)
    return items, gather_items(x, items, block)


def scan_nonzero_native(x: torch.Tensor, threads: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted positions (int64) and (K, 1) values of the nonzero elements of a 32-bit CPU tensor, by the
    C scan: one streaming read, no temporary of the bucket's size. Room for 1/32 of the elements is
    guessed; a denser bucket is scanned again with room for all."""
    x = x.contiguous()
    n = x.numel()
    threads = kernel_threads() if threads is None else threads
    room = n // 32 + 64
    while True:
        pos = torch.empty(room, dtype=torch.int64)
        vals = torch.empty(room, dtype=x.dtype)
        count = native.scan_nonzero(x.data_ptr(), n, x.dtype == torch.float32, pos.data_ptr(),
                                    vals.data_ptr(), room, threads)
        if count <= room:
            return pos[:count], vals[:count].unsqueeze(1)
        room = count


def check_support_indices(support: torch.Tensor, n: int) -> None:
    """Raise unless ``support`` is a 1-D int64/int32 tensor of element indices in [0, n)."""
    is_indices = isinstance(support, torch.Tensor) and support.dtype in (torch.int64, torch.int32)
    if not is_indices or support.dim() != 1:
        raise TypeError("support must be a 1-D int64/int32 tensor of element indices")
    if support.numel() and (int(support.min()) < 0 or int(support.max()) >= n):
        raise ValueError(f"support holds element indices outside [0, {n})")


def support_items(support: torch.Tensor, block: int) -> torch.Tensor:
    """Sorted distinct item numbers of a known support (element indices of every nonzero, checked)."""
    return torch.unique(torch.div(support.to(torch.int64), block, rounding_mode="floor"))


def gather_items(x: torch.Tensor, items: torch.Tensor, block: int) -> torch.Tensor:
    """(K, block) rows of ``x`` for sorted ``items``; the short last item is zero-padded."""
    n = x.numel()
    full = n // block
    if block == 1:
        return x.gather(0, items).unsqueeze(1)
    rows = x[: full * block].view(full, block)
    if full * block == n or items.numel() == 0 or int(items[-1]) < full:
        return rows.index_select(0, items)
    out = torch.zeros((items.numel(), block), dtype=x.dtype, device=x.device)
    out[:-1] = rows.index_select(0, items[:-1])
    tail = x[full * block :]
    out[-1, : tail.numel()] = tail
    return out


def fill_items(out: torch.Tensor, items: torch.Tensor, rows: torch.Tensor, block: int,
               threads: int | None = None) -> None:
    """Write ``out`` whole: (K, block) ``rows`` at sorted ``items``, zero elsewhere. On a CPU with the
    compiled kernels and a 32-bit dtype, in one pass (a zero fill and then a scatter write it twice), on
    up to ``threads`` threads (default ``kernel_threads()``)."""
    if (out.device.type == "cpu" and native is not None and out.element_size() == 4 and out.is_contiguous()
            and rows.dtype == out.dtype and items.dtype == torch.int64):
        items, rows = items.contiguous(), rows.contiguous()
        native.fill_items(out.data_ptr(), out.numel(), items.data_ptr(), rows.data_ptr(), items.numel(),
                          block, kernel_threads() if threads is None else threads)
        return
    out.zero_()
    scatter_items(out, items, rows, block)


def scatter_items(out: torch.Tensor, items: torch.Tensor, rows: torch.Tensor, block: int) -> None:
    """Write (K, block) ``rows`` into ``out`` at sorted ``items`` (the short last item is truncated)."""
    n = out.numel()
    full = n // block
    if block == 1:
        out.index_copy_(0, items, rows.view(-1))
        return
    if full * block == n or items.numel() == 0 or int(items[-1]) < full:
        out[: full * block].view(full, block).index_copy_(0, items, rows)
        return
    out[: full * block].view(full, block).index_copy_(0, items[:-1], rows[:-1])
    out[full * block :] = rows[-1, : n - full * block]
