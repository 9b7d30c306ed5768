"""Packed sequences (``nn.utils.rnn.pack_padded_sequence`` / ``pad_packed_sequence``) on fake
tensors.

Their shapes depend on the sequence lengths, a CPU int64 tensor in PyTorch ("``batch_sizes``
must be a CPU int64 tensor", ``aten/src/ATen/native/PackedSequence.cpp``): host values, which a
fake tensor does not keep. The tracer keeps them: integer vectors made from Python numbers
(``torch.as_tensor(lengths)``), 1-D integer CPU inputs of the workload and their host-side
sorts are constant fake tensors (``FakeTensor.constant``), and packing and padding are run
here as ``PackedSequence.cpp`` runs them on any device:

- pack: the input sliced in one block per distinct length, each made contiguous, and one
  ``cat``; its backward is ``_pack_padded_sequence_backward``: a zero gradient and one copy
  per timestep;
- pad: ``full`` with the padding value and one copy per block of equal batch size (autograd
  through those copies, as the op is composite).

Lengths the trace cannot know (a tensor computed on the device) are taken as full length,
an upper bound stated in the trace's assumptions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from nnperf.trace.assumptions import assume

UNKNOWN_LENGTHS = ("packed sequences: lengths computed on the device are unknown to a fake trace; "
                   "every sequence is taken as full length (an upper bound)")


def int_values(t: Any) -> list[int] | None:
    """The values of a host integer vector, where the trace knows them."""
    if isinstance(t, FakeTensor):
        return [int(v) for v in t.constant.tolist()] if t.constant is not None else None
    if isinstance(t, Tensor):
        return [int(v) for v in t.tolist()]
    return None


def host_constant(values: Tensor) -> Tensor:
    """A real host tensor as a constant fake of the fake mode under way (no op recorded: it
    is host bookkeeping, not device work), marked as living on the host; the tensor itself
    on real tensors."""
    mode = fake_mode()
    if mode is None:
        return values
    with _disable_current_modes():
        fake = mode.fake_tensor_converter.from_real_tensor(mode, values, make_constant=True)
    return mark_host(fake)


_HOST = "_nnperf_host"


def mark_host(t: Tensor) -> Tensor:
    """Mark a constant fake as a host tensor (reading it is no device synchronization)."""
    setattr(t, _HOST, True)
    return t


def is_host(t: Any) -> bool:
    """A constant fake the trace keeps as a host tensor (lengths, batch sizes)."""
    return isinstance(t, FakeTensor) and t.constant is not None and getattr(t, _HOST, False)


def fake_mode() -> FakeTensorMode | None:
    """The fake tensor mode of the trace under way (None for a ``--real`` trace)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


def _is_int_list(data: Any) -> bool:
    return isinstance(data, (list, tuple)) and bool(data) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in data)


#: Host-side integer work on lengths that the tracer folds (keeping values): creating an
#: integer vector from Python numbers, and what code does with one on the host (sort it for
#: ``enforce_sorted=False``, index it, convert it).
_CREATE = {torch.as_tensor, torch.tensor}
_ON_HOST = {torch.sort, Tensor.sort, Tensor.__getitem__, Tensor.to, Tensor.cpu, Tensor.long,
            Tensor.int, Tensor.contiguous}


def folds(func: Any) -> bool:
    return func in _CREATE or func in _ON_HOST


def fold(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run host integer work for real and return constant fakes; ``NotImplemented`` where it
    is not such work (or the trace is on real tensors)."""
    if fake_mode() is None:
        return NotImplemented
    if func in _CREATE:
        data = args[0] if args else kwargs.get("data")
        device = kwargs.get("device")
        if not _is_int_list(data) or (device is not None and torch.device(device).type != "cpu"):
            return NotImplemented
        if kwargs.get("dtype") not in (None, torch.int64, torch.int32):
            return NotImplemented
        with _disable_current_modes():
            real = func(*args, **kwargs)
        return host_constant(real)
    t = args[0] if args else None
    if not is_host(t) or any(isinstance(a, Tensor) and not is_host(a) for a in args[1:]):
        return NotImplemented
    with _disable_current_modes():
        real = func(t.constant, *args[1:], **kwargs)
    if not isinstance(real, (Tensor, tuple)):
        return real
    if isinstance(real, tuple):  # sort's (values, indices), a structseq
        return type(real)(tuple(host_constant(v) for v in real))
    return host_constant(real)


class _Pack(torch.autograd.Function):
    """``_pack_padded_sequence`` and its backward, as ``PackedSequence.cpp`` runs them."""

    @staticmethod
    def forward(ctx, input: Tensor, lengths: list[int], batch_first: bool) -> Tensor:
        x = input.transpose(0, 1) if batch_first else input
        ctx.shape, ctx.batch_first = tuple(x.shape), batch_first
        ctx.sizes = batch_sizes(lengths)
        blocks, prev = [], 0
        batch = len(lengths)
        for i in range(batch):
            length = lengths[batch - 1 - i]
            if length > prev:
                block = x[prev:length, : batch - i].contiguous()
                blocks.append(block.view(-1, *x.shape[2:]))
                prev = length
        return torch.cat(blocks)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        grad_input = grad.new_zeros(ctx.shape)
        offset = 0
        for i, size in enumerate(ctx.sizes):
            grad_input[i, :size].copy_(grad[offset: offset + size])
            offset += size
        return (grad_input.transpose(0, 1) if ctx.batch_first else grad_input), None, None


def batch_sizes(lengths: list[int]) -> list[int]:
    """How many sequences are still running at each timestep (lengths sorted decreasing)."""
    return [sum(1 for length in lengths if length > t) for t in range(max(lengths))]


def pack_padded(input: Tensor, lengths: Tensor, batch_first: bool) -> tuple[Tensor, Tensor]:
    """``torch._pack_padded_sequence`` on a fake input: (data, batch_sizes)."""
    values = int_values(lengths)
    if values is None:
        assume(UNKNOWN_LENGTHS)
        steps = input.shape[1] if batch_first else input.shape[0]
        values = [int(steps)] * int(lengths.shape[0])
    data = _Pack.apply(input, values, batch_first)
    with _disable_current_modes():
        sizes = torch.tensor(batch_sizes(values), dtype=torch.int64)
    return data, host_constant(sizes)


def pad_packed(data: Tensor, sizes_t: Tensor, batch_first: bool, padding_value: float,
               total_length: int) -> tuple[Tensor, Tensor]:
    """``torch._pad_packed_sequence`` on fake data: (padded, lengths)."""
    sizes = int_values(sizes_t)
    if sizes is None:
        return NotImplemented
    steps = max(total_length, len(sizes)) if total_length > 0 else len(sizes)
    batch = sizes[0]
    output = data.new_full((steps, batch, *data.shape[1:]), padding_value)
    offset, start = 0, 0
    for i in range(1, len(sizes) + 1):
        size = sizes[i] if i < len(sizes) else 0
        if size != sizes[start]:
            n = sizes[start] * (i - start)
            block = data[offset: offset + n].view(i - start, sizes[start], *data.shape[1:])
            output[start:i, : sizes[start]].copy_(block)
            offset, start = offset + n, i
    lengths = [sum(1 for s in sizes if s > b) for b in range(batch)]
    with _disable_current_modes():
        lengths_t = torch.tensor(lengths, dtype=torch.int64)
    return (output.transpose(0, 1) if batch_first else output), host_constant(lengths_t)
