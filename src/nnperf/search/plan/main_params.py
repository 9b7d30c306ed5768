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
they are alive the whole step, so they add to the peak as they are. So does ZeRO-1 over one
data-parallel rank (the distributed optimizer shards nothing there, and the trace applies no
data-parallel engine to one rank): its states whole, in the dtypes its ``optimizer_states`` names,
its main gradients in fp32 where ``grad_reduce_in_fp32`` keeps them so.

Counted here, on the planned layout, from the parameters its ranks hold: the memory, the
optimizer state and the fit. Not timed: the fp32 step's extra traffic (the main parameters and
fp32 moments read and written, the cast to and from them: about 20 bytes a parameter once a
step, under 1% of the steps these layouts run), which the plan's note says.
"""

from __future__ import annotations

from dataclasses import replace

from nnperf.hardware import DTYPE_BYTES, GPU
from nnperf.layout import OPTIMIZER_STATES, Execution
from nnperf.passes.memory.capacity import capacity, fits
from nnperf.search.plan.results import Planned
from nnperf.search.plan.states import MIRRORS
from nnperf.trace.options import TraceOptions

#: The 16-bit dtypes whose DDP layouts hold fp32 main states.
HALF_PRECISION = ("bf16", "fp16")


def holds_main_params(execution: Execution, options: TraceOptions) -> bool:
    """Whether ``execution`` runs Megatron-LM's optimizer beside a 16-bit model on whole
    parameters (module docstring): DDP, or ZeRO-1 over one data-parallel rank."""
    whole = execution.data == "ddp" or (execution.shards_optimizer_only and not execution.applies_data_engine)
    return (whole and execution.megatron_layout and options.dtype in HALF_PRECISION
            and not options.amp and options.optimizer in MIRRORS)


def main_state_bytes(parameter_bytes: float, options: TraceOptions, execution: Execution) -> float:
    """The optimizer-state bytes Megatron-LM's optimizer holds beyond the traced ones (moments in
    the 16-bit dtype) for ``parameter_bytes`` of 16-bit parameters: the main copy and the moments
    in the dtypes of ``execution.optimizer_states`` (fp32 both: Megatron-LM's default)."""
    states = OPTIMIZER_STATES[execution.optimizer_states]
    half = DTYPE_BYTES[options.dtype]
    main = DTYPE_BYTES[states.main] if states.main else 0
    return parameter_bytes / half * (main + MIRRORS[options.optimizer] * (DTYPE_BYTES[states.moments] - half))


def main_gradient_bytes(parameter_bytes: float, options: TraceOptions, execution: Execution) -> float:
    """The gradient bytes beyond the traced 16-bit ones: fp32 main gradients in their place
    where ``execution.grad_reduce_in_fp32``."""
    if not execution.grad_reduce_in_fp32:
        return 0.0
    half = DTYPE_BYTES[options.dtype]
    return parameter_bytes / half * (DTYPE_BYTES["fp32"] - half)


def with_main_params(planned: Planned, execution: Execution, options: TraceOptions, gpu: GPU) -> Planned:
    """``planned`` with Megatron-LM's fp32 main states counted where its DDP holds them: its
    peak grows by the states of the rank holding the most parameters (a pipeline's ranks hold
    different blocks), its optimizer state by its reported rank's."""
    if not holds_main_params(execution, options) or planned.state_bytes is None:
        return planned
    holdings = planned.pipeline.parameter_bytes_per_rank.values() if planned.pipeline else ()
    most = max(holdings, default=planned.state_bytes.parameters)
    extra = main_state_bytes(most, options, execution) + main_gradient_bytes(most, options, execution)
    own = planned.state_bytes.parameters
    counted = replace(planned, memory_bytes=int(planned.memory_bytes + extra),
                      state_bytes=replace(planned.state_bytes,
                                          gradients=planned.state_bytes.gradients
                                          + main_gradient_bytes(own, options, execution),
                                          optimizer_state=planned.state_bytes.optimizer_state
                                          + main_state_bytes(own, options, execution)))
    counted.fits = fits(counted.memory_bytes, capacity(gpu))
    return counted
