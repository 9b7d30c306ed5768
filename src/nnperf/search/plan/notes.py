"""What a plan says besides its numbers: why the winner wins (``why``), the notes on what a
layout leaves out (``notes``, ``routing_note``), and where nothing fits, the smallest memory
reached and what could still shrink it (``smallest_memory``).
"""

from __future__ import annotations

from typing import Any

from nnperf.layout import Execution
from nnperf.passes.memory.capacity import capacity
from nnperf.request import ModelRequest
from nnperf.search.plan.rank import SCALE_POINTS
from nnperf.search.plan.results import Plan, Planned
from nnperf.trace.capture import FP8_ASSUMPTION, FUSED_ASSUMPTION
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel.vocab_parallel_loss import runs_megatron_loss

#: Megatron-LM's column-parallel linears keep their sequence shard (``trace.parallel.sequence_shards``)
#: in a cast model, which is how Megatron-LM runs 16 bits; under autocast the plan keeps DTensor's.
AUTOCAST_SEQUENCE_PARALLEL = (
    "DDP and ZeRO-1 beside sequence parallelism under --amp: the column-parallel linears save their "
    "all-gathered input, as DTensor's do; Megatron-LM, which casts the model instead (plan with --dtype), "
    "saves each rank's 1/tp of it and gathers it again in backward")


#: Megatron-LM's layouts with tensor parallelism, planned without its --tp-comm-overlap: the blocks'
#: sequence-parallel collectives wait before or after their GEMMs (``passes.comm_timeline``).
EXPOSED_TENSOR_PARALLEL = (
    "DDP and ZeRO-1 beside sequence parallelism: each block's all-gathers and forward reduce-scatters "
    "are timed before or after their GEMMs; Megatron-LM's --tp-comm-overlap (Transformer Engine's "
    "userbuffers) runs them in chunks beside the GEMMs: plan with --tp-comm-overlap to time that")

#: torch's layouts with sequence parallelism and compiled blocks, without async TP
EXPOSED_TORCH_TENSOR_PARALLEL = (
    "torch's tensor parallelism with compiled blocks: each block's all-gathers and reduce-scatters are timed "
    "before or after their matmuls; torchtitan's async tensor parallelism (enable_async_tensor_parallel) "
    "pipelines them with the matmuls: plan with --async-tp to time that")

#: what async TP does to memory is not modelled
ASYNC_TP_MEMORY = (
    "async tensor parallelism: memory as without it; its symmetric-memory buffers, allocated outside "
    "PyTorch's caching allocator, are not counted, nor any change it makes to what the compiled blocks hold "
    "(torchtitan's Llama 3.1 70B on 256 H100 logged 67.6 GiB with it, 71.9 GiB without)")


#: Megatron-LM's 1F1B waits for each pipeline send before the stage's next action
#: (``Execution.blocking_pipeline_sends``, ``passes.pipeline_timeline``).
BLOCKING_PIPELINE_SENDS = (
    "Megatron-LM's 1F1B pipelines (DDP or ZeRO-1): each stage waits for its sends to the next and previous "
    "stage before its next forward or backward (counted as exposed send_recv); "
    "its interleaved schedule overlaps them (--schedule interleaved-1f1b --vpp V: Megatron-LM's "
    "--num-layers-per-virtual-pipeline-stage)")


#: Megatron-LM's layouts compute the loss with Megatron-Core's function, torchtitan's with DTensor's
#: loss parallelism (``trace.parallel.vocab_parallel_loss``).
MEGATRON_CROSS_ENTROPY = (
    "Megatron-LM's layouts (ZeRO-1, or DDP beside tensor, pipeline or context parallelism): cross entropy runs "
    "as Megatron-Core's "
    "vocab_parallel_cross_entropy (the logits, or with tensor parallelism the rank's vocabulary slice, upcast "
    "once to fp32 and turned into their softmax and gradient in place); FSDP layouts run PyTorch's, "
    "torchtitan's loss_parallel with tensor parallelism")


#: DDP's optimizer is PyTorch's on the model's own weights; ZeRO-1's keeps Megatron-LM's fp32 main
#: copies (``trace.parallel.distributed_optimizer``).
DDP_HALF_PRECISION = (
    "DDP runs the optimizer on the {dtype} weights themselves, as PyTorch does (Adam's moments in {dtype}, 4 "
    "bytes a parameter), where ZeRO-1 keeps Megatron-LM's fp32 main parameters and moments; DDP beside tensor, "
    "pipeline or context parallelism, which only Megatron-LM runs, holds those too: counted in its memory "
    "(12 bytes a parameter), its optimizer step timed on the {dtype} weights (about 20 bytes a parameter of "
    "memory traffic less, once a step)")


#: Megatron-Core's default splits each expert over the tensor-parallel ranks; the search tries
#: the winner's degrees with them whole too, and leaves the rest to --etp 1 (every expert layout
#: again would double the layouts to trace).
EXPERT_OVERLAP_WITH_TENSOR = (
    "the expert overlap beside tensor parallelism: Megatron-LM warns against it on Hopper and earlier "
    "(megatron/training/arguments.py): tensor parallelism wants CUDA_DEVICE_MAX_CONNECTIONS=1, so its "
    "collectives start ahead of the GEMMs they overlap, the overlap a larger value; the plan keeps the "
    "tensor-parallel overlap as one hardware queue orders it, and may count more of the all-to-alls hidden "
    "than such a run hides (the Megatron MoE Model Zoo's Qwen3-235B at TP 2 measured 19.7 s a step without "
    "the overlap and 17.6 s with it: validation/multi_gpu/megatron_moe_modelzoo_runs.toml)")

#: Context parallelism is timed in closed form (``search.plan.context``), not traced.
CONTEXT_PARALLEL = (
    "context parallelism is timed in closed form, as torchtitan runs it with its all-gather rotate method "
    "(search.plan.context): each layer's keys and values all-gathered over the context ranks and "
    "their gradients reduce-scattered, counted exposed (an upper bound), attention over the whole "
    "sequence's causal pairs; Megatron-LM's arguments say --cp-comm-type all_gather, the same "
    "scheme (its default p2p ring overlaps the exchange with attention)")


#: A Megatron-style layout planned in fp32: Megatron-LM trains with --bf16 or --fp16.
FP32_MEGATRON = (
    "planned in {dtype}: Megatron-LM's runs hold the model in 16 bits (--bf16), and its arguments for "
    "this plan carry no precision flag; plan with --amp bf16 (or --dtype bf16) to time that")


SPLIT_EXPERTS = (
    "experts beside tensor parallelism are split over its ranks, as Megatron-Core's default "
    "(--expert-tensor-parallel-size equal to the tensor degree): their rows gathered and scattered over the "
    "tensor ranks every layer; kept whole on a rank instead (--expert-tensor-parallel-size 1, the expert group "
    "folded over the tensor ranks, as the DeepSeek-V3 and Qwen3 recipes run) they need no such collectives: the "
    "search tried the fastest layout's degrees that way too; plan with --etp 1 to rank every layout so")


#: torch's pipeline stages allocate their receive buffers for the whole step; Megatron-LM's as they
#: receive (``passes.memory.transfers``).
TORCH_RECEIVE_BUFFERS = (
    "pipelines planned as torch's run torch's stages (torchtitan's), which allocate a buffer for every "
    "micro-batch's received activation and output gradient when the schedule first runs and hold them all "
    "step: counted in their memory, growing with the micro-batches; Megatron-LM allocates each as it "
    "receives and frees each output once sent (plan with --framework megatron for its pipelines)")


#: ZeRO-1 with fp32 main gradients accumulates in DDP's 16-bit buckets, timed and not held
#: (``trace.parallel.distributed_optimizer``).
FP32_MAIN_GRADIENTS = (
    "ZeRO-1 with fp32 main gradients (--grad-reduce-in-fp32): held in fp32 (4 bytes a parameter) and "
    "reduce-scattered in fp32, as Megatron-LM does; timed as accumulated in {dtype} and cast to fp32 once a "
    "step, where Megatron-LM's fused weight-gradient GEMMs accumulate in fp32 every micro-batch")


def notes(request: ModelRequest, options: TraceOptions, results: list[Planned], layers: int | None) -> list[str]:
    notes = []
    if options.fp8:
        notes.append(FP8_ASSUMPTION.format(count="the"))
    if options.pointwise == "fused":
        notes.append(FUSED_ASSUMPTION.format(count="the"))
    if layers and layers > SCALE_POINTS[-1]:
        notes.append(f"the {layers}-block stack is traced with {SCALE_POINTS[0]} and {SCALE_POINTS[1]} blocks "
                     "per stage and extrapolated linearly (exact for state bytes, collectives and FLOPs; "
                     "per phase for memory)")
    if options.amp and any(p.execution.keeps_sequence_shards for p in results):
        notes.append(AUTOCAST_SEQUENCE_PARALLEL)
    if any(p.execution.megatron_sequence_parallel and not p.execution.tp_comm_overlap for p in results):
        notes.append(EXPOSED_TENSOR_PARALLEL)
    if options.pointwise == "fused" and any(p.execution.tensor > 1 and p.execution.sequence_parallel
                                            and not p.execution.megatron_layout and not p.execution.async_tp
                                            for p in results):
        notes.append(EXPOSED_TORCH_TENSOR_PARALLEL)
    if any(p.execution.async_tp for p in results):
        notes.append(ASYNC_TP_MEMORY)
    if any(p.execution.pipeline > 1 and not p.execution.megatron_layout
           and p.execution.grad_accum > p.execution.pipeline for p in results):
        notes.append(TORCH_RECEIVE_BUFFERS)
    if any(p.execution.blocking_pipeline_sends for p in results):
        notes.append(BLOCKING_PIPELINE_SENDS)
    if any(runs_megatron_loss(p.execution, options) for p in results):
        notes.append(MEGATRON_CROSS_ENTROPY)
    if options.dtype in ("bf16", "fp16") and any(p.execution.data == "ddp" and p.execution.data_parallel > 1
                                                  for p in results):
        notes.append(DDP_HALF_PRECISION.format(dtype=options.dtype))
    if any(p.execution.grad_reduce_in_fp32 for p in results):
        notes.append(FP32_MAIN_GRADIENTS.format(dtype=options.dtype))
    if any(p.execution.context > 1 for p in results):
        notes.append(CONTEXT_PARALLEL)
    if options.amp is None and options.dtype in (None, "fp32", "fp64") and any(
            p.execution.replicates_parameters for p in results):  # DDP or ZeRO-1: Megatron-LM's arguments
        notes.append(FP32_MEGATRON.format(dtype=options.dtype or "fp32"))
    if any(p.execution.expert_overlap and p.execution.tensor > 1 for p in results):
        notes.append(EXPERT_OVERLAP_WITH_TENSOR)
    if any(p.execution.expert > 1 and p.execution.tensor > 1 and p.execution.expert_tensor is None
           and not p.execution.folds_experts for p in results):
        notes.append(SPLIT_EXPERTS)
    spanning = sorted({p.execution.tensor for p in results if p.execution.tensor > p.execution.gpus_per_node})
    if spanning:
        notes.append(f"tensor parallelism over {', '.join(map(str, spanning))} GPUs spans nodes of "
                     f"{results[0].execution.gpus_per_node}: its all-gathers, reduce-scatters and all-reduces "
                     "cross the network and are timed at its bandwidth")
    if any(p.execution.pipeline > 1 for p in results) and _ties_embeddings(request):
        notes.append("tied embeddings under pipeline parallelism: their gradient all-reduce between the "
                     "first and last stage is not traced")
    return notes


def _ties_embeddings(request: ModelRequest) -> bool:
    """A built-in model whose output head shares the token embedding's weight."""
    from nnperf.zoo import find_model
    from nnperf.zoo.gpt2 import TIED_EMBEDDINGS

    spec = find_model(request.target)
    return spec is not None and spec.name in TIED_EMBEDDINGS


def routing_note(info: tuple[Any, dict[str, Any], int | None] | None, options: TraceOptions) -> list[str]:
    """A mixture-of-experts model's routing is an assumption of every traced rank: say which."""
    from nnperf.trace.parallel.expert import has_experts
    from nnperf.trace.routing import Routing

    experts = has_experts(info[0]) if info is not None else 0
    if not experts:
        return []
    routing = Routing(options.moe_load, options.moe_capacity_factor)
    return [routing.describe(experts, info[1].get("top_k", 1)) + "; under expert parallelism every rank routes "
            "as the traced one (rank 0, holding the busiest experts)"]


#: The share of the step the host's issuing takes from which a layout is called host-bound (the
#: device idles between the host's launches).
HOST_BOUND = 0.9


def why(best: Planned, others: list[Planned]) -> str:
    split = best.split
    assert split is not None  # a ranked layout is timed
    exposed = split.exposed_s
    text = f"fastest: {split.compute_s / best.step_s:.0%} of the step is compute, " \
           f"{exposed / best.step_s:.0%} exposed communication"
    bubble = split.pipeline_bubble_s
    if bubble:
        text += f", {bubble / best.step_s:.0%} pipeline bubble"
    host = split.host_s
    if host >= HOST_BOUND * best.step_s:
        text += f"; host-bound: issuing the ops takes the host {host / best.step_s:.0%} of the step"
    if others:
        text += f"; next best {others[0].execution.describe()} is {others[0].step_s / best.step_s - 1:.1%} slower"
    return text


def smallest_memory(plan_: Plan) -> str:
    """Nothing fits: the smallest per-GPU memory any layout reached and what would make it fit."""
    least = min((p for p in plan_.rejected if not p.time_bound), key=lambda p: p.memory_bytes)
    need = least.memory_bytes / capacity(plan_.gpu)
    at_least = "at least " if least.memory_bound else ""
    return (f"no layout of {plan_.model} fits on {plan_.gpus} x {plan_.gpu.name}: the smallest is "
            f"{at_least}{least.memory_bytes / 2**30:.1f} GiB per GPU ({least.execution.describe()}) against "
            f"{capacity(plan_.gpu) / 2**30:.1f} GiB; it needs {at_least}{need:.1f}x the memory: "
            + ", ".join(_remedies(plan_.options, least.execution, least.loss_saved_bytes, _beside_state(least))))


#: Below this, what an eager loss keeps is not worth naming as a remedy.
_LOSS_REMEDY_BYTES = 2**30


def _beside_state(planned: Planned) -> tuple[float, float] | None:
    """What a traced layout holds beside its persistent state (activations, the loss's copies,
    workspace), and that state, in bytes; None for a bound (not traced)."""
    if planned.state_bytes is None or planned.memory_bound:
        return None
    state = planned.state_bytes.total
    return max(0.0, planned.memory_bytes - planned.context_bytes - state), state


def _remedies(options: TraceOptions, smallest: Execution, loss_saved: int = 0,
              beside_state: tuple[float, float] | None = None) -> list[str]:
    """What could still shrink the smallest layout: only what the plan did not already use.
    Activation checkpointing is named where the search was kept from it (``--checkpoint``) and
    what the layout holds beside its parameters, gradients and optimizer state is the larger."""
    out = ["more GPUs to shard over"]
    if options.train and smallest.checkpoint != "full" and beside_state and beside_state[0] > beside_state[1]:
        held, state = beside_state
        out.append(f"activation checkpointing (--checkpoint full): it holds {held / 2**30:.1f} GiB of activations "
                   f"and working memory beside {state / 2**30:.1f} GiB of parameters, gradients and optimizer state")
    if options.loss == "eager" and not smallest.loss_fusion and loss_saved >= _LOSS_REMEDY_BYTES:
        out.append(f"a compiled or chunked loss (--loss compiled: torchtitan's [compile] components = [\"loss\"]; "
                   f"--loss chunked: its ChunkedLossWrapper): the eager cross entropy keeps "
                   f"{loss_saved / 2**30:.1f} GiB of copies of the logits for backward")
    if smallest.micro_batch > 1:
        out.append("a smaller micro-batch")
    if options.amp is None and options.dtype in (None, "fp32", "fp64"):
        out.append("bf16 (--amp bf16)")
    if options.train and options.optimizer in ("adamw", "adam"):
        out.append(f"an optimizer with less state than {options.optimizer} (two fp32 moments per "
                   "parameter; --optimizer sgd keeps none)")
    if smallest.model_parallel == 1:
        out.append("tensor/pipeline parallelism")
    return out
