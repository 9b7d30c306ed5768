"""FlexAttention (``torch.nn.attention.flex_attention``) the way a GPU runs it.

On a GPU, ``flex_attention`` is one fused kernel each way (the higher-order ops
``torch.ops.higher_order.flex_attention`` and ``flex_attention_backward``, which inductor turns
into a Triton template), and it skips the key blocks its ``BlockMask`` marks empty: the work is
the (query, key) pairs of the non-empty 128 x 128 blocks, not the whole score matrix. The trace
records both higher-order ops as they are (``trace.recorder``), and keeps with each what its
cost depends on and a fake tensor does not tell: the pairs the mask keeps and the pairs of the
blocks the kernel computes (``OpEvent.values``).

Those counts come from the mask itself: ``mask_mod`` evaluated on real indices, outside the
fake mode, block row by block row (``mask_pairs``). That works for every mask written from the
indices and constants (causal, sliding window, prefix-LM, ...). A mask that reads tensors the
trace only has as fakes (document ids from the batch: block-causal document masking) cannot be
evaluated; the kernel is then costed over every pair, the upper bound, and the trace says so.

Four things PyTorch does on CPU tensors are not what it does on the GPU, so they are changed
for the duration of a trace (``tracing``):
- ``flex_attention`` refuses a backward on CPU (``_validate_device``): the CPU fakes stand for
  the GPU's tensors;
- uncompiled, it calls its op through an eager ``torch.compile``, which dynamo declines under
  the recorder's dispatch mode: the op is called directly instead
  (``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``, what PyTorch offers for debugging score_mods);
- the op's autograd rule builds example scalars and traces the score_mod's backward on each
  call: bookkeeping no GPU kernel runs, kept out of the recording (``recorder.unrecorded``);
- a ``torch.compile``d flex_attention (torchtitan's) would compile kernels for fake tensors:
  compiled functions run eagerly instead (``_eager``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

try:  # torch >= 2.5
    import torch.nn.attention.flex_attention as _flex

    FORWARD = torch.ops.higher_order.flex_attention
    BACKWARD = torch.ops.higher_order.flex_attention_backward
    HIGHER_ORDER_OPS: tuple[Any, ...] = (FORWARD, BACKWARD)
except (ImportError, AttributeError):  # no FlexAttention: no model can call it
    _flex = None
    HIGHER_ORDER_OPS = ()

#: Score-matrix elements evaluated at most per mask (block rows of ``mask_mod`` on the CPU, a
#: few milliseconds per 2**24): 2**31 is 46k x 46k, a couple of seconds the first time.
MAX_MASK_ELEMENTS = 1 << 31
_CHUNK_ELEMENTS = 1 << 24

MASK_UNKNOWN = ("FlexAttention: the block mask reads tensor values the fake trace does not have "
                "(e.g. document ids from the batch), so the kernel is costed over every "
                "(query, key) pair, an upper bound; trace with --real to count the mask's blocks")
MASK_TOO_LARGE = ("FlexAttention: a {q}x{kv} mask over {bh} batch x head slices is too large to "
                  "evaluate ({n:.2g} elements, limit {limit:.2g}); the kernel is costed over every "
                  "(query, key) pair, an upper bound")
MASK_BLOCKS_GIVEN = ("FlexAttention: a BlockMask built from fake block tensors (BlockMask.from_kv_blocks) "
                     "is not counted; the kernel is costed over every (query, key) pair, an upper bound")


def serve_fake_mode(mode_type: type) -> None:
    """Give a FakeTensorMode subclass the fake kernels PyTorch registers for FakeTensorMode
    itself: a higher-order op looks its mode's rule up by exact type."""
    for op in HIGHER_ORDER_OPS:
        if mode_type not in op.python_key_table:
            op.py_impl(mode_type)(op.python_key_table[FakeTensorMode])


@dataclass(frozen=True)
class MaskPairs:
    """(query, key) pairs of one attention call, summed over its batch and query heads:
    ``kept`` by the mask, ``executed`` by the kernel (every pair of a non-empty block)."""

    kept: int
    executed: int


#: The block size flex_attention gives the one block of a call without a mask
#: (``_LARGE_SPARSE_BLOCK_SIZE``, 2**30 in torch 2.13).
_NO_MASK_BLOCK = getattr(_flex, "_LARGE_SPARSE_BLOCK_SIZE", 1 << 30)


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """flex_attention as the GPU runs it, for the duration of a trace (module docstring)."""
    if _flex is None:
        yield
        return
    kernels = FORWARD.py_kernels
    autograd = kernels.get(DispatchKey.Autograd)
    validate, debug = _flex._validate_device, _flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG

    from nnperf.trace.recorder import unrecorded  # the recorder imports this module

    def set_up_unrecorded(*args: Any, **kwargs: Any) -> Any:
        # the higher-order op itself, called inside, is recorded all the same
        with unrecorded():
            return autograd(*args, **kwargs)

    _flex._validate_device = _validate_on_any_device
    _flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    if autograd is not None:
        kernels[DispatchKey.Autograd] = set_up_unrecorded
    try:
        with _eager():
            yield
    finally:
        _flex._validate_device, _flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = validate, debug
        if autograd is not None:
            kernels[DispatchKey.Autograd] = autograd
        _evaluated_pairs.cache_clear()


def _eager() -> contextlib.AbstractContextManager:
    """Functions the model compiled (``torch.compile(flex_attention)``, as torchtitan calls it)
    run eagerly: a trace records ops, and inductor must not compile kernels for fake tensors
    (it does wherever the recorder's dispatch mode is not active, e.g. a pipeline stage's shape
    inference: on CPU fakes it crashes)."""
    set_stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def _validate_on_any_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """``_validate_device`` without its CPU-backward refusal (the CPU fakes stand for CUDA)."""


def hop_call_parts(func: Any, args: tuple) -> tuple[tuple, tuple, list[torch.Tensor]]:
    """The parts of a flex op's arguments the trace keeps: the attention tensors and the scale
    (forward: q, k, v, scale; backward: q, k, v, out, logsumexp, grad_out, scale), the block
    mask tuple, and every tensor the kernel reads (those and the mask's block tensors)."""
    if func is FORWARD:
        q, k, v, _score_mod, block_mask, scale = args[:6]
        main = (q, k, v, scale)
    else:
        q, k, v, out, lse, grad_out, _grad_lse, _fw, _joint, block_mask, scale = args[:11]
        main = (q, k, v, out, lse, grad_out, scale)
    read = [t for t in main if isinstance(t, torch.Tensor)]
    read += [t for t in block_mask if isinstance(t, torch.Tensor)]
    return main, tuple(block_mask), read


def mask_pairs(block_mask: tuple, query: torch.Tensor, key: torch.Tensor,
               assume: Callable[[str], None]) -> MaskPairs:
    """The pairs one call keeps and computes, from its block mask (``BlockMask.as_tuple()``:
    the block tensors, the block sizes and ``mask_mod``; the lengths are the tensors', which
    flex_attention checks against a mask's own, except for its one-block "no mask"). Where
    the mask cannot be evaluated, every pair, and ``assume`` is told why."""
    q_len, kv_len = int(query.shape[-2]), int(key.shape[-2])
    kv_num_blocks = block_mask[2]
    q_block, kv_block, mask_mod = int(block_mask[-3]), int(block_mask[-2]), block_mask[-1]
    batch, heads = int(query.shape[0]), int(query.shape[1])
    dense = MaskPairs(batch * heads * q_len * kv_len, batch * heads * q_len * kv_len)
    if q_block >= _NO_MASK_BLOCK and kv_block >= _NO_MASK_BLOCK:
        return dense  # no block mask given: flex_attention's one block covering everything
    mask_b, mask_h = int(kv_num_blocks.shape[0]), int(kv_num_blocks.shape[1])
    if mask_mod is _flex.noop_mask:
        if isinstance(kv_num_blocks, FakeTensor):
            assume(MASK_BLOCKS_GIVEN)
            return dense
        return _scaled(_given_blocks(block_mask, q_len, kv_len, q_block, kv_block), batch, heads, mask_b, mask_h)
    elements = mask_b * mask_h * q_len * kv_len
    if elements > MAX_MASK_ELEMENTS:
        assume(MASK_TOO_LARGE.format(q=q_len, kv=kv_len, bh=mask_b * mask_h, n=elements,
                                     limit=MAX_MASK_ELEMENTS))
        return dense
    try:
        pairs = _evaluated_pairs(_MaskKey(mask_mod), mask_b, mask_h, q_len, kv_len, q_block, kv_block)
    except Exception:  # the mask reads fake tensors (or anything else a real index cannot feed)
        assume(MASK_UNKNOWN)
        return dense
    return _scaled(pairs, batch, heads, mask_b, mask_h)


def _scaled(pairs: MaskPairs, batch: int, heads: int, mask_b: int, mask_h: int) -> MaskPairs:
    """A mask made for one batch row or head (B or H None: size 1) applies to all of them."""
    factor = (batch // mask_b if mask_b else 1) * (heads // mask_h if mask_h else 1)
    return MaskPairs(pairs.kept * factor, pairs.executed * factor)


def _block_extents(length: int, block: int) -> torch.Tensor:
    """Rows (or columns) in each block of ``length``: the last block may be cut short."""
    n = -(-length // block)
    sizes = torch.full((n,), block, dtype=torch.int64)
    sizes[-1] = length - block * (n - 1)
    return sizes


class _MaskKey:
    """A mask_mod as a cache key: its code and the values it closes over, where those are
    plain (a model builds a new closure per step or per micro-batch: the same mask); else the
    function object itself."""

    def __init__(self, mask_mod: Callable) -> None:
        self.mask_mod = mask_mod
        code = getattr(mask_mod, "__code__", None)
        cells = tuple(c.cell_contents for c in getattr(mask_mod, "__closure__", None) or ())
        defaults = getattr(mask_mod, "__defaults__", None) or ()
        plain = all(isinstance(v, int | float | bool | str | type(None)) for v in cells + defaults)
        self.key = (code, cells, defaults) if code is not None and plain else (mask_mod,)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _MaskKey) and self.key == other.key


@functools.lru_cache(maxsize=64)
def _evaluated_pairs(key: _MaskKey, mask_b: int, mask_h: int, q_len: int, kv_len: int,
                     q_block: int, kv_block: int) -> MaskPairs:
    """``mask_mod`` on real indices, a band of block rows at a time: the pairs it keeps, and the
    pairs of the blocks that keep any (what the kernel computes). Cached per trace: every layer
    of a model usually attends with the same mask."""
    mask_mod = key.mask_mod
    rows_per_band = max(q_block, (_CHUNK_ELEMENTS // max(1, mask_b * mask_h * kv_len)) // q_block * q_block)
    kept = executed = 0
    with _disable_current_modes(), torch.no_grad():  # real tensors, whatever mode the trace is in
        cols = _block_extents(kv_len, kv_block)
        kv_pad = cols.numel() * kv_block - kv_len
        for start in range(0, q_len, rows_per_band):
            band = min(rows_per_band, q_len - start)

            def shifted(b: Any, h: Any, q: Any, kv: Any, start: int = start) -> Any:
                return mask_mod(b, h, q + start, kv)

            mask = _flex.create_mask(shifted, mask_b, mask_h, band, kv_len, device="cpu")
            kept += int(mask.sum())
            rows = _block_extents(band, q_block)
            padded = torch.nn.functional.pad(mask, (0, kv_pad, 0, rows.numel() * q_block - band))
            blocks = padded.view(mask_b, mask_h, rows.numel(), q_block, cols.numel(), kv_block).any(dim=(3, 5))
            executed += int((blocks * torch.outer(rows, cols)).sum())
    return MaskPairs(kept, executed)


def _given_blocks(block_mask: tuple, q_len: int, kv_len: int, q_block: int, kv_block: int) -> MaskPairs:
    """A BlockMask of real block tensors with no ``mask_mod`` (``BlockMask.from_kv_blocks``):
    every pair of each listed block (partial and full) is kept and computed."""
    total = 0
    with _disable_current_modes():
        rows, cols = _block_extents(q_len, q_block), _block_extents(kv_len, kv_block)
        for num, idx in ((block_mask[2], block_mask[3]), (block_mask[4], block_mask[5])):
            if num is None:
                continue
            listed = torch.arange(idx.shape[-1]) < num.unsqueeze(-1)  # [B, H, q blocks, slots]
            width = cols[idx.clamp(max=cols.numel() - 1).long()] * listed
            total += int((width.sum(-1) * rows[: num.shape[-1]]).sum())
    return MaskPairs(total, total)
