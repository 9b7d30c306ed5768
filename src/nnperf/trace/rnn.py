"""Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) as the cuDNN RNN CUDA runs.

On CUDA, ``torch.lstm``/``gru``/``rnn_tanh``/``rnn_relu`` take cuDNN's path whenever
``use_cudnn`` holds (``aten/src/ATen/native/RNN.cpp``: fp32, fp16, fp64, and bf16 where
``supportsBFloat16RNNWithCuDNN``, i.e. compute capability >= 8.0): one ``aten::_cudnn_rnn``
for every layer, direction and timestep, and one ``aten::_cudnn_rnn_backward`` (its
backward data pass always runs, "because it mutates reserve"; its weight pass when a
weight needs a gradient; ``aten/src/ATen/native/cudnn/RNN.cpp``). On the CPU the same call
is oneDNN's ``mkldnn_rnn_layer`` per layer and direction (LSTM) or one ``addmm`` per
timestep and a dozen pointwise ops (GRU, RNN): neither is what a GPU runs.

The tracer therefore routes those calls to ``nnperf::cudnn_rnn`` and its backward
``nnperf::cudnn_rnn_backward``, the ``_cudnn_rnn`` pair with the arguments the cost formulas
and the time model need. Not ``aten::_cudnn_rnn`` itself: its fake implementation returns
an empty reserve buffer (a TODO in ``torch/_meta_registrations.py``) and its backward has
none, and it wants the flat weight buffer ``flatten_parameters`` makes on CUDA only.

Under CUDA autocast cuDNN RNNs run in fp16 whatever autocast's dtype
(``aten/src/ATen/cudnn/AutocastRNN.cpp``, ``_cudnn_rnn_cast_reflatten`` casts the input,
states and weights with ``at::kHalf``): the weights are copied into a flat fp16 buffer and
the input and states cast, which the tracer records as the casts they are.

Real implementations exist too (the CPU RNN functions), so ``--real`` traces compute
correct values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from nnperf.kernels.rnn import GATES as CELL_GATES
from nnperf.kernels.rnn import MODES
from nnperf.trace.packing import int_values

#: cuDNN's ``cudnnRNNMode_t`` values, which ``aten::_cudnn_rnn`` takes as ``mode``.
RNN_RELU, RNN_TANH, LSTM, GRU = 0, 1, 2, 3
#: Gates per cell: the recurrent and input GEMMs have N = gates x hidden size.
GATES = {mode: CELL_GATES[cell] for mode, cell in MODES.items()}

_FUNCTIONS = {torch.lstm: LSTM, torch.gru: GRU, torch.rnn_tanh: RNN_TANH, torch.rnn_relu: RNN_RELU}
_CPU_FUNCTIONS = {LSTM: torch.lstm, GRU: torch.gru, RNN_TANH: torch.rnn_tanh, RNN_RELU: torch.rnn_relu}
#: What ``use_cudnn`` accepts (bf16 on compute capability >= 8.0: assumed of the target).
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.float64, torch.bfloat16)


def is_rnn_function(func: object) -> bool:
    return func in _FUNCTIONS


def weights_per_layer(mode: int, has_biases: bool, proj_size: int) -> int:
    """``weight_stride0``: w_ih, w_hh, (b_ih, b_hh), (w_hr) per layer and direction."""
    return 2 + 2 * bool(has_biases) + (1 if proj_size and mode == LSTM else 0)


def reserve_elements(
    mode: int, input_size: int, hidden_size: int, proj_size: int, num_layers: int,
    bidirectional: bool, tokens: int,
) -> int:
    """Elements of cuDNN's training reserve space: what its backward reads back.

    ``cudnnGetRNNTempSpaceSizes`` gives the figure at run time; its formula is not
    published. Counted here is what the backward needs per layer, direction and token:
    the gate activations (gates x hidden), the cell state (LSTM), the hidden state before
    the projection (LSTM with ``proj_size``), and every layer's output but the last (the
    next layer's input, for its weight gradient; the last one is ``output`` itself). The
    dropout masks between layers are not counted. An estimate, flagged as such in the docs.
    """
    del input_size  # the layer-0 input is the op's own input, saved separately
    directions = 2 if bidirectional else 1
    out = proj_size or hidden_size
    per_cell = GATES[mode] * hidden_size + (hidden_size if mode == LSTM else 0)
    per_cell += hidden_size if proj_size else 0
    cells = num_layers * directions * tokens * per_cell
    intermediate = (num_layers - 1) * tokens * directions * out
    return cells + intermediate


def _tokens(input: Tensor, batch_sizes: list[int]) -> int:
    if batch_sizes:
        return int(input.shape[0])
    return int(input.shape[0] * input.shape[1])


def _shapes(input, hx, mode, hidden_size, proj_size, num_layers, batch_first, bidirectional, batch_sizes):
    directions = 2 if bidirectional else 1
    out = proj_size or hidden_size
    if batch_sizes:
        output_shape = (input.shape[0], out * directions)
        batch = batch_sizes[0]
    else:
        seq, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
        output_shape = (batch, seq, out * directions) if batch_first else (seq, batch, out * directions)
    cell = (num_layers * directions, batch, hidden_size) if mode == LSTM else (0,)
    return output_shape, cell


@torch.library.custom_op("nnperf::cudnn_rnn", mutates_args=())
def cudnn_rnn(
    input: Tensor,
    weights: list[Tensor],
    hx: Tensor,
    cx: Tensor | None,
    mode: int,
    hidden_size: int,
    proj_size: int,
    num_layers: int,
    has_biases: bool,
    batch_first: bool,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_sizes: list[int],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """cuDNN's RNN forward: (output, hy, cy, reserve). ``cy`` is empty except for LSTM;
    ``reserve`` holds what backward needs when ``train`` (bytes, as cuDNN's buffer)."""
    output, hy, cy = _cpu_forward(input, weights, hx, cx, mode, num_layers, has_biases, batch_first,
                                  dropout, train, bidirectional, batch_sizes)
    return output, hy, cy, _reserve(input, mode, hidden_size, proj_size, num_layers, bidirectional,
                                    train, batch_sizes)


@cudnn_rnn.register_fake
def _cudnn_rnn_fake(input, weights, hx, cx, mode, hidden_size, proj_size, num_layers, has_biases,
                    batch_first, dropout, train, bidirectional, batch_sizes):
    output_shape, cell = _shapes(input, hx, mode, hidden_size, proj_size, num_layers, batch_first,
                                 bidirectional, batch_sizes)
    output = input.new_empty(output_shape)
    hy = torch.empty_like(hx, memory_format=torch.contiguous_format)
    cy = input.new_empty(cell) if cx is None else torch.empty_like(cx, memory_format=torch.contiguous_format)
    return output, hy, cy, _reserve(input, mode, hidden_size, proj_size, num_layers, bidirectional,
                                    train, batch_sizes)


def _reserve(input, mode, hidden_size, proj_size, num_layers, bidirectional, train, batch_sizes) -> Tensor:
    if not train:
        return input.new_empty((0,), dtype=torch.uint8)
    elements = reserve_elements(mode, input.shape[-1], hidden_size, proj_size, num_layers, bidirectional,
                                _tokens(input, batch_sizes))
    return input.new_empty((elements * input.element_size(),), dtype=torch.uint8)


def _cpu_forward(input, weights, hx, cx, mode, num_layers, has_biases, batch_first, dropout, train,
                 bidirectional, batch_sizes):
    """The CPU RNN function on real tensors (``--real``): same values as cuDNN's."""
    fn = _CPU_FUNCTIONS[mode]
    state = [hx, cx] if mode == LSTM else hx
    if batch_sizes:
        sizes = torch.tensor(batch_sizes, dtype=torch.int64)
        out = fn(input, sizes, state, weights, has_biases, num_layers, dropout, train, bidirectional)
    else:
        out = fn(input, state, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    if mode == LSTM:
        return out[0], out[1], out[2]
    return out[0], out[1], input.new_empty((0,))


@torch.library.custom_op("nnperf::cudnn_rnn_backward", mutates_args=())
def cudnn_rnn_backward(
    input: Tensor,
    hx: Tensor,
    cx: Tensor | None,
    output: Tensor,
    grad_output: Tensor | None,
    grad_hy: Tensor | None,
    grad_cy: Tensor | None,
    reserve: Tensor,
    weights: list[Tensor],
    mode: int,
    hidden_size: int,
    proj_size: int,
    num_layers: int,
    has_biases: bool,
    batch_first: bool,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_sizes: list[int],
    output_mask: list[bool],
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """cuDNN's RNN backward: (dx, dhx, dcx, dweights). The weights come last among the
    tensors, as the operand whose dtype the GEMMs run in. Backward data always runs (it computes
    dx, dhx, dcx even where no gradient is wanted); backward weights when ``output_mask[3]``.
    On real tensors the gradients come from autograd over the CPU function (a recompute)."""
    with _autograd_below_autograd():
        x = input.detach().requires_grad_()
        h = hx.detach().requires_grad_()
        c = cx.detach().requires_grad_() if cx is not None else None
        ws = [w.detach().requires_grad_() for w in weights]
        out, hy, cy = _cpu_forward(x, ws, h, c, mode, num_layers, has_biases, batch_first, dropout,
                                   train, bidirectional, batch_sizes)
        pairs = [(t, g) for t, g in ((out, grad_output), (hy, grad_hy), (cy, grad_cy)) if g is not None]
        wanted = [x, h] + ([c] if c is not None else []) + ws
        grads = torch.autograd.grad([t for t, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
    dx, dh = _or_zeros(grads[0], x), _or_zeros(grads[1], h)
    dc = _or_zeros(grads[2], c) if c is not None else input.new_empty((0,))
    dws = [_or_zeros(g, w) for g, w in zip(grads[-len(ws):], ws, strict=True)] if output_mask[3] else []
    return dx, dh, dc, dws


def _or_zeros(grad: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if grad is None else grad.detach()


@contextlib.contextmanager
def _autograd_below_autograd() -> Iterator[None]:
    """Autograd inside a custom op's kernel, which runs with the autograd keys excluded:
    the recompute of the real backward needs a graph of its own."""
    keys = torch._C.DispatchKey
    exclude = (torch._C._dispatch_tls_local_exclude_set()
               - torch._C.DispatchKeySet(keys.AutogradFunctionality)
               - torch._C.DispatchKeySet(keys.AutogradOther))
    include = torch._C._dispatch_tls_local_include_set()
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


@cudnn_rnn_backward.register_fake
def _cudnn_rnn_backward_fake(input, hx, cx, output, grad_output, grad_hy, grad_cy, reserve, weights, mode,
                             hidden_size, proj_size, num_layers, has_biases, batch_first, dropout, train,
                             bidirectional, batch_sizes, output_mask):
    dx = torch.empty_like(input, memory_format=torch.contiguous_format)
    dh = torch.empty_like(hx, memory_format=torch.contiguous_format)
    dc = torch.empty_like(cx, memory_format=torch.contiguous_format) if cx is not None else input.new_empty((0,))
    dws = [torch.empty_like(w) for w in weights] if output_mask[3] else []
    return dx, dh, dc, dws


def _setup_context(ctx, inputs, output):
    (input, weights, hx, cx, mode, hidden_size, proj_size, num_layers, has_biases, batch_first,
     dropout, train, bidirectional, batch_sizes) = inputs
    out, _, _, reserve = output
    ctx.save_for_backward(input, hx, cx, out, reserve, *weights)
    ctx.params = (mode, hidden_size, proj_size, num_layers, has_biases, batch_first, dropout, train,
                  bidirectional, list(batch_sizes))
    ctx.mask = [input.requires_grad, hx.requires_grad, cx is not None and cx.requires_grad,
                any(w.requires_grad for w in weights)]
    ctx.set_materialize_grads(False)  # an unused hy/cy gradient stays None, as autograd gives it


def _backward(ctx, grad_output, grad_hy, grad_cy, grad_reserve):
    input, hx, cx, out, reserve, *weights = ctx.saved_tensors
    dx, dh, dc, dws = torch.ops.nnperf.cudnn_rnn_backward(
        input, hx, cx, out, grad_output, grad_hy, grad_cy, reserve, weights, *ctx.params, ctx.mask
    )
    mask = ctx.mask
    dws = list(dws) if mask[3] else [None] * len(weights)
    # the gradients' structure must mirror the inputs': an empty int list is an empty list
    # there, a non-empty one a leaf
    no_sizes = None if ctx.params[-1] else []
    return (dx if mask[0] else None, dws, dh if mask[1] else None,
            dc if mask[2] else None) + (None,) * 9 + (no_sizes,)


cudnn_rnn.register_autograd(_backward, setup_context=_setup_context)


def cudnn_rnn_call(func: object, args: tuple, kwargs: dict) -> object:
    """Run a ``torch.lstm``/``gru``/``rnn_tanh``/``rnn_relu`` call as cuDNN's RNN and return
    what the CPU function returns: (output, hy[, cy]). Returns ``NotImplemented`` where CUDA
    would not take cuDNN's path either (a dtype ``use_cudnn`` refuses)."""
    mode = _FUNCTIONS[func]
    bound = _bind(mode, list(args) + list(kwargs.values()))
    input, hx = bound["input"], bound["hx"]
    if input.dtype not in _CUDNN_DTYPES or bound["batch_sizes"] is None:
        return NotImplemented
    h, c = (hx[0], hx[1]) if mode == LSTM else (hx, None)
    weights = list(bound["params"])
    has_biases, num_layers = bool(bound["has_biases"]), int(bound["num_layers"])
    per_layer = len(weights) // (num_layers * (2 if bound["bidirectional"] else 1))
    hidden_size = int(weights[0].shape[0]) // GATES[mode]  # w_ih: (gates x hidden, input)
    projected = mode == LSTM and per_layer == weights_per_layer(mode, has_biases, 1)
    proj_size = int(weights[per_layer - 1].shape[0]) if projected else 0  # w_hr: (proj, hidden)
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        # _cudnn_rnn_cast_reflatten: everything in fp16 whatever autocast's dtype
        input, h = input.to(torch.float16), h.to(torch.float16)
        c = c.to(torch.float16) if c is not None else None
        weights = [w.to(torch.float16) for w in weights]
    with _no_autocast():
        output, hy, cy, _ = torch.ops.nnperf.cudnn_rnn(
            input, weights, h, c, mode, hidden_size, proj_size, num_layers, has_biases,
            bool(bound["batch_first"]), float(bound["dropout"]), bool(bound["train"]),
            bool(bound["bidirectional"]), bound["batch_sizes"],
        )
    return (output, hy, cy) if mode == LSTM else (output, hy)


def _no_autocast():
    return torch.autocast("cpu", enabled=False)


def _bind(mode: int, values: list) -> dict:
    """The arguments of the ``input`` (padded) or ``data`` (packed) overload by name."""
    # lstm(input, hx: Tensor[], ...) / lstm(data, batch_sizes: Tensor, hx: Tensor[], ...);
    # gru(input, hx: Tensor, params: Tensor[], ...) / gru(data, batch_sizes, hx: Tensor, ...)
    packed = isinstance(values[1], Tensor) if mode == LSTM else isinstance(values[2], Tensor)
    if packed:
        names = ("input", "batch_sizes", "hx", "params", "has_biases", "num_layers", "dropout", "train",
                 "bidirectional")
        bound = dict(zip(names, values, strict=False))
        bound["batch_sizes"] = int_values(bound["batch_sizes"])
        bound["batch_first"] = False
        return bound
    names = ("input", "hx", "params", "has_biases", "num_layers", "dropout", "train", "bidirectional",
             "batch_first")
    bound = dict(zip(names, values, strict=False))
    bound["batch_sizes"] = []
    return bound
