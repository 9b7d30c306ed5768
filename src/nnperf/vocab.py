"""The closed sets of words nnperf writes into its JSON, CSV and tables, one enum each.

They were plain strings, so a typo (``"optimiser"``) compared unequal without a word. Each
member *is* its string (``class X(str, Enum)``; Python 3.10 has no ``StrEnum``): it hashes,
compares, sorts, formats and serializes exactly like its value, so ``Phase.FORWARD ==
"forward"``, ``{"forward": 1}[Phase.FORWARD]``, ``f"{Phase.FORWARD}"`` and ``json.dumps``
all behave as they did with the bare strings, and code that still writes the string
literal keeps working while it moves over.

This module imports nothing of nnperf, so any layer (trace, passes, reports) can use it.
"""

from __future__ import annotations

from enum import Enum


class Vocab(str, Enum):
    """A member formats as its value (not ``Phase.FORWARD``), in ``str()`` and f-strings alike."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class Phase(Vocab):
    """Which part of a training step issued an op (the loss runs in ``FORWARD``)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class StorageKind(Vocab):
    """What a storage holds; decides the memory breakdown and which bytes are weight bytes."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    INPUT = "input"
    GRADIENT = "gradient"
    #: gradients the modelled engine never holds: DDP's 16-bit buckets beside fp32 main gradients,
    #: standing in for the weight-gradient GEMMs' outputs that Megatron-LM's fused accumulation
    #: writes into its fp32 buffer (``trace.parallel.distributed_optimizer``): their traffic is
    #: timed, their bytes are not held on the device
    UNHELD_GRADIENT = "unheld_gradient"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATION = "activation"


class Category(Vocab):
    """An op's cost category: decides which kernel model times it."""

    GEMM = "gemm"  # matmul-like: tensor cores, tile/wave quantization
    CONV = "conv"  # convolution (implicit GEMM)
    ATTENTION = "attention"  # fused flash attention: FLOPs at the tensor-core rate
    ELEMENTWISE = "elementwise"  # memory-bound pointwise
    REDUCTION = "reduction"
    NORM = "norm"
    MEMORY = "memory"  # copies, casts, cat, index, fills
    OPTIMIZER = "optimizer"  # foreach / fused optimizer kernels
    ALLOC = "alloc"  # allocation only: no kernel
    HOST = "host"  # runs on the host (scalar bookkeeping, .item()): no device kernel
    COMMUNICATION = "communication"  # a collective: timed by kernels.collectives on its own stream
    UNCOVERED = "uncovered"  # no cost formula: reported with its count, never a silent zero


class Bound(Vocab):
    """What limits an op, a module or the step in the time model."""

    COMPUTE = "compute"  # the math units (modeled FLOP time is the largest term)
    MEMORY = "memory"  # memory bandwidth
    LAUNCH = "launch"  # per-kernel launch overhead
    HOST = "host"  # the device waits for the host to issue work
    NONE = "none"  # no kernel (a view, an allocation, a host-only op)


class MemoryCategory(Vocab):
    """Breakdown categories of peak memory, in the order tables print them. Every byte of the
    replayed trace falls in exactly one, so they add up to the requested bytes at the peak."""

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    INPUTS = "inputs"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    AMP_WEIGHT_CASTS = "amp_weight_casts"
    SAVED_ACTIVATIONS = "saved_activations"
    FORWARD_TEMPORARIES = "forward_temporaries"
    BACKWARD_TEMPORARIES = "backward_temporaries"
    OPTIMIZER_TEMPORARIES = "optimizer_temporaries"
    WORKSPACES = "workspaces"
