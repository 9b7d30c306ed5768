"""The fp32 main parameters and moments Megatron-LM's DDP holds beside a 16-bit model.

A ``--dtype bf16`` or ``fp16`` model under DDP is traced with PyTorch's optimizer on the 16-bit
weights themselves: Adam's moments in the model's dtype, 4 bytes a parameter of optimizer state.
Where only Megatron-LM (or Megatron-DeepSpeed) runs the layout (``Execution.megatron_layout``:
DDP beside tensor, pipeline or context parallelism, or with one of its own settings), its
mixed-precision optimizer keeps an fp32 main copy of every parameter and its moments in fp32
(megatron/core/optimizer/optimizer.py, ``Float16OptimizerWithFloat16Params``: "fp32_from_float16
groups"; DeepSpeed's FP16_Optimizer and BF16_Optimizer alike): 4 bytes of main parameter and 4
bytes of each moment, 12 with Adam, where the trace counts 4. ZeRO-1 traces those states itself
(``trace.parallel.distributed_optimizer``), sharded; DDP holds them whole on every rank, and
they are alive the whole step, so they add to the peak as they are.

Counted here, on the planned layout, from the parameters its ranks hold: the memory, the
optimizer state and the fit. Not timed: the fp32 step's extra traffic (the main parameters and
fp32 moments read and written, the cast to and from them: about 20 bytes a parameter once a
step, under 1% of the steps these layouts run), which the plan's note says.
"""

from __future__ import annotations

from dataclasses import replace

from nnperf.hardware import DTYPE_BYTES, GPU
from nnperf.layout import Execution
from nnperf.passes.memory.capacity import capacity, fits
from nnperf.search.plan.results import Planned
from nnperf.search.plan.states import MIRRORS
from nnperf.trace.options import TraceOptions

#: The 16-bit dtypes whose DDP layouts hold fp32 main states.
HALF_PRECISION = ("bf16", "fp16")


def holds_main_params(execution: Execution, options: TraceOptions) -> bool:
    """Whether ``execution`` runs DDP as Megatron-LM does beside a 16-bit model (module
    docstring): its optimizer keeps fp32 main parameters and moments on every rank."""
    return (execution.data == "ddp" and execution.megatron_layout and options.dtype in HALF_PRECISION
            and not options.amp and options.optimizer in MIRRORS and execution.optimizer_states == "fp32")


def main_state_bytes(parameter_bytes: float, options: TraceOptions) -> float:
    """The bytes Megatron-LM's optimizer holds beyond the traced ones for ``parameter_bytes`` of
    16-bit parameters: an fp32 main copy, and each moment in fp32 rather than 16 bits."""
    half, full = DTYPE_BYTES[options.dtype], DTYPE_BYTES["fp32"]
    return parameter_bytes / half * (full + MIRRORS[options.optimizer] * (full - half))


def with_main_params(planned: Planned, execution: Execution, options: TraceOptions, gpu: GPU) -> Planned:
    """``planned`` with Megatron-LM's fp32 main states counted where its DDP holds them: its
    peak grows by the states of the rank holding the most parameters (a pipeline's ranks hold
    different blocks), its optimizer state by its reported rank's."""
    if not holds_main_params(execution, options) or planned.state_bytes is None:
        return planned
    holdings = planned.pipeline.parameter_bytes_per_rank.values() if planned.pipeline else ()
    most = max(holdings, default=planned.state_bytes.parameters)
    extra = main_state_bytes(most, options)
    own = main_state_bytes(planned.state_bytes.parameters, options)
    counted = replace(planned, memory_bytes=int(planned.memory_bytes + extra),
                      state_bytes=replace(planned.state_bytes,
                                          optimizer_state=planned.state_bytes.optimizer_state + own))
    counted.fits = fits(counted.memory_bytes, capacity(gpu))
    return counted
