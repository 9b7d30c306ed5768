"""cuDNN's recurrent layers (LSTM, GRU, Elman RNN): their GEMMs, pointwise work and time.

What cuDNN computes, per layer and direction (cuDNN 5's design, kept since: Appleyard,
Kočiský, Blunsom, "Optimizing Performance of Recurrent Neural Networks on GPUs",
arXiv:1604.01946, 2016, and NVIDIA's blog "Optimizing Recurrent Neural Networks in cuDNN 5"):

- the input projection of every timestep at once, one large GEMM
  (M = tokens, N = gates x hidden, K = layer input), since it does not depend on the
  recurrence ("combining input GEMMs");
- then, timestep after timestep, the recurrent GEMM (M = batch at that step, N = gates x
  hidden, K = hidden, or the projection size for an LSTM with ``proj_size``), an LSTM's
  projection GEMM (M = batch, N = proj, K = hidden), and one fused kernel of the gate
  pointwise maths ("fusing element-wise operations");
- backward data runs the recurrence in reverse (M = batch, N = hidden, K = gates x hidden)
  and then one large GEMM for the input gradient; backward weights are large GEMMs over
  every timestep (dW_ih, dW_hh, dW_hr) and bias sums.

Sequential steps are small GEMMs: launch- and latency-bound, which is why an RNN step is
timed one step at a time with the GEMM model, not as one GEMM of the summed FLOPs. Where the
steps of independent chains can share the GPU, they run side by side: the two directions of
a bidirectional layer, and the layers of a unidirectional stack in a wavefront (layer l at
step t beside layer l+1 at step t-1: "streaming layers", Appleyard et al. §4), as long as
their CTAs fit on the SMs together.

Which algorithm: PyTorch's ``get_algo`` (``aten/src/ATen/native/cudnn/RNN.cpp``) picks
``CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H`` (cuDNN >= 8.2.1, compute capability >= 6, not fp64,
not packed, hidden <= 384 (RNN) / 192 (LSTM, GRU) forward, <= 256 / 128 backward),
``PERSIST_STATIC`` (fp16, one unidirectional layer, hidden <= 1024 and a multiple of 128,
input a multiple of 128, and the device rules of ``use_persist_device_heuristics``), else
``STANDARD``; an LSTM with projections always ``STANDARD``. A persistent kernel keeps the
recurrent weights on chip for the whole sequence (Diamos et al., "Persistent RNNs: Stashing
Recurrent Weights On-Chip", ICML 2016): one launch, no weight traffic per step; its per-step
grid synchronization is not modeled (no published figure found).

Math: fp16 runs on tensor cores (``CUDNN_TENSOR_OP_MATH``); fp32 with
``torch.backends.cudnn.allow_tf32`` (the default) runs ``CUDNN_DEFAULT_MATH``, which allows
TF32 on Ampere and later (``aten/src/ATen/cudnn/Descriptors.h``, ``RNNDescriptor::set``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from nnperf.hardware import GPU, DeviceProfile

#: Cell kinds and their gates: the GEMMs of a step have N = gates x hidden.
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
#: cuDNN's ``cudnnRNNMode_t`` values, the ``mode`` ``aten::_cudnn_rnn`` takes.
MODES = {0: "rnn_relu", 1: "rnn_tanh", 2: "lstm", 3: "gru"}

STANDARD = "standard"
PERSIST_STATIC = "persist_static"
PERSIST_STATIC_SMALL_H = "persist_static_small_h"

FORWARD = "forward"
BACKWARD_DATA = "backward_data"
BACKWARD_WEIGHTS = "backward_weights"

# Pointwise FLOPs per hidden unit and token, counting each operation once and each
# transcendental (tanh, exp) as one, sigmoid as 4 (1 / (1 + exp(-x))), as nnperf counts the
# same maths elsewhere (``passes.costs.elementwise``). ``b`` = 1 with biases, else 0.
#: LSTM forward: gate pre-activations (x-part + h-part, + b_ih + b_hh) 4 x (1 + 2b);
#: sigmoid(i, f, o) 12, tanh(g) 1; c' = f*c + i*g 3; h' = o * tanh(c') 2.
def lstm_forward_flops(b: int) -> int:
    return 4 * (1 + 2 * b) + 12 + 1 + 3 + 2


#: GRU forward: r, z pre-activations 2 x (1 + 2b), sigmoid(r, z) 8; n = tanh(x_n + b_in +
#: r * (h_n + b_hn)): adds 1 + 2b, multiply 1, tanh 1; h' = (1 - z) * n + z * h 4.
def gru_forward_flops(b: int) -> int:
    return 2 * (1 + 2 * b) + 8 + (1 + 2 * b) + 1 + 1 + 4


#: Elman RNN forward: pre-activation 1 + 2b, tanh or relu 1.
def rnn_forward_flops(b: int) -> int:
    return (1 + 2 * b) + 1


#: Backward through one cell, per hidden unit and token (the chain rule written out):
#: LSTM: tanh(c) 1; do = dh*tanh(c)*o(1-o) 4; dc = dc' + dh*o*(1-tanh(c)^2) 5;
#: di = dc*g*i(1-i) 4; df = dc*c_prev*f(1-f) 4; dg = dc*i*(1-g^2) 4; dc_prev = dc*f 1;
#: dh = dh_out + dh_recurrent 1 -> 24.
#: GRU: dn = dh(1-z) 2; dz = dh(h-n) 2; dh_prev direct dh*z 1; dz_pre = dz*z(1-z) 3;
#: dn_pre = dn(1-n^2) 3; dr = dn_pre*(h_n + b_hn) 1; dr_pre = dr*r(1-r) 3; dh_n = dn_pre*r 1;
#: dh = dh_out + dh_recurrent 1; dh_prev = direct + GEMM 1 -> 18.
#: tanh RNN: dpre = dh(1-h^2) 3, dh accumulate 1 -> 4; relu RNN: dh*(h>0) 1 + 1 -> 2.
BACKWARD_POINTWISE = {"lstm": 24, "gru": 18, "rnn_tanh": 4, "rnn_relu": 2}


@dataclass(frozen=True)
class RnnGeometry:
    """One cuDNN RNN call: the cell, its sizes, and the batch at each timestep (equal for a
    padded batch, decreasing for a packed sequence)."""

    cell: str
    input_size: int
    hidden_size: int
    proj_size: int
    num_layers: int
    bidirectional: bool
    steps: tuple[int, ...]
    has_biases: bool = True

    @property
    def gates(self) -> int:
        return GATES[self.cell]

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def out_size(self) -> int:
        """What a layer emits per direction: the projection size, else the hidden size."""
        return self.proj_size or self.hidden_size

    @property
    def tokens(self) -> int:
        return sum(self.steps)

    def layer_input(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.directions * self.out_size

    # -- GEMMs ------------------------------------------------------------------------------
    def gemms(self, part: str) -> list[RnnGemm]:
        """Every GEMM of one part (``FORWARD``, ``BACKWARD_DATA``, ``BACKWARD_WEIGHTS``), layer by
        layer and direction by direction, the per-step ones in the order they run."""
        out: list[RnnGemm] = []
        gh, r, p, h, n = self.gates * self.hidden_size, self.out_size, self.proj_size, self.hidden_size, self.tokens
        for layer in range(self.num_layers):
            i = self.layer_input(layer)
            for d in range(self.directions):
                order = self._step_order(part, d)
                if part == FORWARD:
                    out.append(RnnGemm(layer, d, "input", n, gh, i))
                    for t in order:
                        out.append(RnnGemm(layer, d, "recurrent", self.steps[t], gh, r, t))
                        if p:
                            out.append(RnnGemm(layer, d, "projection", self.steps[t], p, h, t))
                elif part == BACKWARD_DATA:
                    for t in order:
                        if p:
                            out.append(RnnGemm(layer, d, "projection", self.steps[t], h, p, t))
                        out.append(RnnGemm(layer, d, "recurrent", self.steps[t], r, gh, t))
                    out.append(RnnGemm(layer, d, "input", n, i, gh))
                else:
                    out.append(RnnGemm(layer, d, "input", gh, i, n))
                    out.append(RnnGemm(layer, d, "recurrent", gh, r, n))
                    if p:
                        out.append(RnnGemm(layer, d, "projection", p, h, n))
        return out

    def _step_order(self, part: str, direction: int) -> range:
        forward_in_time = (direction == 0) == (part == FORWARD)
        t = len(self.steps)
        return range(t) if forward_in_time else range(t - 1, -1, -1)

    def gemm_flops(self, part: str) -> int:
        return sum(g.flops for g in self.gemms(part))

    def pointwise_flops(self, part: str) -> int:
        """The fused gate kernels' FLOPs (forward, backward data), or the bias-gradient sums
        (backward weights: every token's gate gradient added into b_ih and b_hh)."""
        b = int(self.has_biases)
        units = self.num_layers * self.directions * self.tokens * self.hidden_size
        if part == FORWARD:
            per = {"lstm": lstm_forward_flops, "gru": gru_forward_flops}.get(self.cell, rnn_forward_flops)(b)
            return units * per
        if part == BACKWARD_DATA:
            return units * BACKWARD_POINTWISE[self.cell]
        return units * self.gates * 2 * b


@dataclass(frozen=True)
class RnnGemm:
    """One GEMM of an RNN call. ``step`` is the timestep of a per-step GEMM (None: one GEMM
    over every timestep)."""

    layer: int
    direction: int
    kind: str  # "input" | "recurrent" | "projection"
    m: int
    n: int
    k: int
    step: int | None = None

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


# -- algorithm --------------------------------------------------------------------------------
def cudnn_algorithm(geometry: RnnGeometry, dtype: str, gpu: GPU, forward: bool) -> str:
    """The cuDNN RNN algorithm PyTorch's ``get_algo`` picks (``aten/src/ATen/native/cudnn/RNN.cpp``,
    assuming cuDNN >= 8.2.1) for this call on ``gpu``."""
    if geometry.proj_size:
        return STANDARD  # "LSTM with projections only works with standard algorithm"
    packed = len(set(geometry.steps)) > 1
    if packed:
        return STANDARD  # persistent algorithms refuse varying sequence lengths
    major, minor = _capability(gpu)
    if dtype != "fp64" and major >= 6 and _persist_small_h(geometry, forward):
        return PERSIST_STATIC_SMALL_H
    if dtype == "fp16" and _persist_common(geometry) and _persist_device(geometry, gpu, major, minor):
        return PERSIST_STATIC
    return STANDARD


def _capability(gpu: GPU) -> tuple[int, int]:
    parts = (gpu.compute_capability or "").split(".")
    if gpu.vendor != "NVIDIA" or len(parts) != 2 or not all(p.isdigit() for p in parts):
        return 0, 0  # not cuDNN (MIOpen on AMD): the standard algorithm's structure
    return int(parts[0]), int(parts[1])


def _persist_small_h(g: RnnGeometry, forward: bool) -> bool:
    """``use_rnn_persist_small_h``."""
    gated = g.cell in ("lstm", "gru")
    if forward:
        return g.hidden_size <= (192 if gated else 384)
    return g.hidden_size <= (128 if gated else 256)


def _persist_common(g: RnnGeometry) -> bool:
    """``use_persist_common_heuristics``."""
    return (g.num_layers == 1 and g.hidden_size <= 1024 and g.directions == 1
            and g.hidden_size % 128 == 0 and g.input_size % 128 == 0)


def _persist_device(g: RnnGeometry, gpu: GPU, major: int, minor: int) -> bool:
    """``use_persist_device_heuristics``: Volta (not Turing) and sm_80+ parts with >= 98 SMs
    (not sm_86), by batch size and sequence length."""
    b, t = g.steps[0], len(g.steps)
    if major == 7:
        if minor == 5:
            return False
        return (((b % 16 == 0 and b not in (80, 112)) or b == 8)
                and ((t >= 40 and b <= 128) or (t >= 20 and b <= 96) or (t >= 10 and b <= 32)))
    if major >= 8 and gpu.sm_count >= 98:
        if minor == 6 or g.cell == "gru":
            return False
        if g.cell == "lstm":
            return b % 8 == 0 and b <= 128
        return b % 8 == 0 and b <= 128 and (b < 96 or g.hidden_size < 896)
    return False


# -- time -------------------------------------------------------------------------------------
@dataclass
class RnnEstimate:
    """One part of an RNN call on one GPU."""

    part: str
    algorithm: str
    time_s: float
    kernels: int
    compute_s: float  # GEMMs' modeled compute time, summed
    memory_s: float  # GEMMs' and pointwise kernels' modeled memory time, summed
    overhead_s: float  # launch overhead of every kernel
    gemms: list[tuple[RnnGemm, object]] = field(default_factory=list)  # (GEMM, its estimate)


#: ``gemm(m, n, k)`` -> an estimate with ``time_s``, ``model_compute_s``, ``model_memory_s``,
#: ``overhead_s`` and ``ctas`` (``kernels.gemm.GemmEstimate``).
GemmFn = Callable[[int, int, int], object]


def estimate_rnn(
    geometry: RnnGeometry, part: str, dtype_bytes: int, algorithm: str, gpu: GPU,
    profile: DeviceProfile, gemm: GemmFn,
) -> RnnEstimate:
    """Time one part of a cuDNN RNN call (see the module docstring for the structure)."""
    gemms = geometry.gemms(part)
    timed = [(g, gemm(g.m, g.n, g.k)) for g in gemms]
    if part == BACKWARD_WEIGHTS:
        pointwise_s = profile.memory_time(gpu.memory_bandwidth, _bias_bytes(geometry, dtype_bytes))
        kernels = len(timed) + (1 if geometry.has_biases else 0)
        overhead = kernels * profile.kernel_overhead_s
        time = sum(e.time_s for _, e in timed) + pointwise_s + (profile.kernel_overhead_s if geometry.has_biases else 0)
        return RnnEstimate(part, STANDARD, time, kernels, sum(e.model_compute_s for _, e in timed),
                           sum(e.model_memory_s for _, e in timed) + pointwise_s, overhead, timed)
    persistent = algorithm != STANDARD
    big = [(g, e) for g, e in timed if g.step is None]
    stepped = [(g, e) for g, e in timed if g.step is not None]
    big_s = sum(e.time_s for _, e in big)
    # one chain = one (layer, direction): its per-step GEMMs and fused pointwise kernels
    steps: dict[tuple[int, int, int], float] = {}
    ctas = 1
    for g, e in stepped:
        key = (g.layer, g.direction, g.step)
        if persistent:  # weights stay on chip: compute only, no launch per step
            steps[key] = steps.get(key, 0.0) + e.model_compute_s
        else:
            steps[key] = steps.get(key, 0.0) + e.time_s
        ctas = max(ctas, int(getattr(e, "ctas", 1)) or 1)
    pointwise_bytes = _step_pointwise_bytes(geometry, part, dtype_bytes)
    for (layer, d, t) in steps:
        moved = profile.memory_time(gpu.memory_bandwidth, pointwise_bytes * geometry.steps[t])
        steps[(layer, d, t)] += moved + (0.0 if persistent else profile.kernel_overhead_s)
    recurrence = _recurrence_time(geometry, steps, ctas, gpu, persistent)
    chains = geometry.num_layers * geometry.directions
    per_step_kernels = 0 if persistent else len(stepped) + len(steps)
    kernels = len(big) + per_step_kernels + (chains if persistent else 0)
    time = big_s + recurrence + (chains * profile.kernel_overhead_s if persistent else 0.0)
    compute = sum(e.model_compute_s for _, e in timed)
    memory = sum(e.model_memory_s for _, e in big) + sum(
        profile.memory_time(gpu.memory_bandwidth, pointwise_bytes * geometry.steps[t]) for (_, _, t) in steps)
    if not persistent:
        memory += sum(e.model_memory_s for _, e in stepped)
    return RnnEstimate(part, algorithm, time, kernels, compute, memory,
                       kernels * profile.kernel_overhead_s, timed)


def _recurrence_time(g: RnnGeometry, steps: dict[tuple[int, int, int], float], ctas: int, gpu: GPU,
                     persistent: bool) -> float:
    """The sequential part: chains that fit on the SMs together run side by side. A persistent
    kernel fills the GPU, so its chains run one after the other."""
    t_count = len(g.steps)
    per_layer_dir = {(layer, d): sum(steps.get((layer, d, t), 0.0) for t in range(t_count))
                     for layer in range(g.num_layers) for d in range(g.directions)}
    side_by_side = 1 if persistent else max(1, gpu.sm_count // max(1, ctas))
    if g.directions == 2:
        # each layer needs both directions of the one below: layers in turn, directions together
        total = 0.0
        for layer in range(g.num_layers):
            chains = [per_layer_dir[(layer, 0)], per_layer_dir[(layer, 1)]]
            total += max(chains) if side_by_side >= 2 else sum(chains)
        return total
    # unidirectional stack: a wavefront over layers (layer l step t beside layer l+1 step t-1)
    layers = g.num_layers
    together = min(layers, side_by_side)
    mean_step = sum(per_layer_dir.values()) / max(1, layers * t_count)
    rounds = math.ceil(layers / together)
    return mean_step * (t_count * rounds + (together - 1))


def _step_pointwise_bytes(g: RnnGeometry, part: str, dtype_bytes: int) -> int:
    """Bytes the fused gate kernel of one timestep moves per batch row: forward reads both
    GEMM results (2 x gates x hidden) and the cell state (LSTM), writes h, the cell state and
    the gate activations to the reserve (training); backward reads the reserve's gates, the
    cell states and the incoming gradients and writes the gate gradients."""
    gh, h = g.gates * g.hidden_size, g.hidden_size
    cell = h if g.cell == "lstm" else 0
    if part == FORWARD:
        return dtype_bytes * (2 * gh + cell + h + cell + gh)
    return dtype_bytes * (gh + 2 * cell + 2 * h + gh)


def _bias_bytes(g: RnnGeometry, dtype_bytes: int) -> int:
    """The bias gradients: every token's gate gradients read once."""
    if not g.has_biases:
        return 0
    return dtype_bytes * g.num_layers * g.directions * g.tokens * g.gates * g.hidden_size
