"""What a plan says besides its numbers (search.plan.notes): the notes on what layouts leave out."""

from __future__ import annotations

from dataclasses import replace

from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan.notes import (
    ASYNC_TP_MEMORY,
    AUTOCAST_SEQUENCE_PARALLEL,
    BLOCKING_PIPELINE_SENDS,
    CONTEXT_PARALLEL,
    DDP_HALF_PRECISION,
    EXPERT_OVERLAP_WITH_TENSOR,
    EXPOSED_TENSOR_PARALLEL,
    EXPOSED_TORCH_TENSOR_PARALLEL,
    FP32_MEGATRON,
    MEGATRON_CROSS_ENTROPY,
    TORCH_RECEIVE_BUFFERS,
    notes,
)
from nnperf.search.plan.results import Planned
from nnperf.trace.options import TraceOptions


def _notes(*executions: Execution, options: TraceOptions | None = None) -> list[str]:
    return notes(ModelRequest("llama-7b"), options or TraceOptions(), [Planned(e) for e in executions], None)


def test_ddp_of_a_16_bit_model_says_its_optimizer_has_no_fp32_copies():
    """ZeRO-1 keeps fp32 main parameters of a bf16 model, DDP (PyTorch's) does not: a plan with
    both says so; an --amp plan (fp32 weights) or one without DDP has nothing to say."""
    ddp = Execution(world=8, data="ddp")
    note = DDP_HALF_PRECISION.format(dtype="bf16")
    assert note in _notes(ddp, options=TraceOptions(dtype="bf16"))
    assert note not in _notes(ddp, options=TraceOptions(amp="bf16"))
    assert note not in _notes(Execution(world=8, data="zero1"), options=TraceOptions(dtype="bf16"))


def test_megatrons_layouts_under_autocast_say_the_gathered_inputs_are_saved():
    """Megatron-LM's sequence-parallel linears apply to a cast model; under --amp the plan says
    its DDP or ZeRO-1 layouts beside sequence parallelism save DTensor's gathered inputs."""
    megatron = Execution(world=8, data="zero1", tensor=4, sequence_parallel=True)
    assert AUTOCAST_SEQUENCE_PARALLEL in _notes(megatron, options=TraceOptions(amp="bf16"))
    assert AUTOCAST_SEQUENCE_PARALLEL not in _notes(megatron, options=TraceOptions(dtype="bf16"))
    fsdp = Execution(world=8, data="fsdp", tensor=4, sequence_parallel=True)
    assert AUTOCAST_SEQUENCE_PARALLEL not in _notes(fsdp, options=TraceOptions(amp="bf16"))


def test_megatrons_layouts_without_tp_comm_overlap_say_how_to_time_it():
    megatron = Execution(world=8, data="zero1", tensor=4, sequence_parallel=True)
    assert EXPOSED_TENSOR_PARALLEL in _notes(megatron)
    assert EXPOSED_TENSOR_PARALLEL not in _notes(Execution(world=8, data="zero1", tensor=4, sequence_parallel=True,
                                                           tp_comm_overlap=True))
    assert EXPOSED_TENSOR_PARALLEL not in _notes(Execution(world=8, data="fsdp", shard=2, tensor=4,
                                                           sequence_parallel=True))



def test_torchs_compiled_layouts_without_async_tp_say_how_to_time_it():
    torch_tp = Execution(world=8, data="fsdp", shard=2, tensor=4, sequence_parallel=True)
    compiled = TraceOptions(pointwise="fused")
    assert EXPOSED_TORCH_TENSOR_PARALLEL in _notes(torch_tp, options=compiled)
    assert EXPOSED_TORCH_TENSOR_PARALLEL not in _notes(torch_tp)  # eager: async TP needs the compiled blocks
    assert EXPOSED_TORCH_TENSOR_PARALLEL not in _notes(replace(torch_tp, async_tp=True), options=compiled)
    assert ASYNC_TP_MEMORY in _notes(replace(torch_tp, async_tp=True), options=compiled)
    assert ASYNC_TP_MEMORY not in _notes(torch_tp, options=compiled)
    assert EXPOSED_TORCH_TENSOR_PARALLEL not in _notes(Execution(world=8, data="zero1", tensor=4,
                                                                 sequence_parallel=True), options=compiled)


def test_megatrons_1f1b_pipelines_say_their_sends_are_waited_for():
    """Megatron-LM's 1F1B waits for its pipeline sends; its interleaved schedule and torch's
    (FSDP's pipelines) overlap them, and have nothing to say."""
    one_f_one_b = Execution(world=16, data="zero1", pipeline=4, pipeline_schedule="1f1b", grad_accum=8)
    assert BLOCKING_PIPELINE_SENDS in _notes(one_f_one_b)
    assert BLOCKING_PIPELINE_SENDS not in _notes(Execution(world=16, data="zero1", pipeline=4, virtual_stages=2,
                                                           grad_accum=8))
    assert BLOCKING_PIPELINE_SENDS not in _notes(Execution(world=16, data="fsdp", shard=4, pipeline=4,
                                                           pipeline_schedule="1f1b", grad_accum=8))


def test_torchs_pipelines_of_more_micro_batches_than_stages_say_they_hold_every_receive_buffer():
    """torch's stages hold a receive buffer pair for every micro-batch of the step; it matters
    beyond the micro-batches in flight (more micro-batches than stages); Megatron-LM's layouts
    allocate them as they receive."""
    torch_pipeline = Execution(world=16, data="fsdp", shard=4, pipeline=4, pipeline_schedule="1f1b", grad_accum=8)
    assert TORCH_RECEIVE_BUFFERS in _notes(torch_pipeline)
    assert TORCH_RECEIVE_BUFFERS not in _notes(Execution(world=16, data="fsdp", shard=4, pipeline=4,
                                                         pipeline_schedule="1f1b", grad_accum=4))
    assert TORCH_RECEIVE_BUFFERS not in _notes(Execution(world=16, data="zero1", pipeline=4,
                                                         pipeline_schedule="1f1b", grad_accum=8))


def test_megatrons_layouts_say_whose_cross_entropy_they_run():
    """DDP or ZeRO-1 beside tensor parallelism runs Megatron-Core's cross entropy; FSDP's (torchtitan's),
    a loss the user compiles or chunks, and logits gathered for the loss do not."""
    megatron = Execution(world=8, data="ddp", tensor=2)
    assert MEGATRON_CROSS_ENTROPY in _notes(megatron)
    assert MEGATRON_CROSS_ENTROPY not in _notes(Execution(world=8, data="fsdp", shard=4, tensor=2))
    assert MEGATRON_CROSS_ENTROPY not in _notes(megatron, options=TraceOptions(loss="compiled"))
    assert MEGATRON_CROSS_ENTROPY not in _notes(Execution(world=8, data="ddp", tensor=2, loss_parallel=False))


def test_the_expert_overlap_beside_tensor_parallelism_says_what_megatron_warns_of():
    folded = Execution(world=16, data="zero1", tensor=2, sequence_parallel=True, expert=8, expert_tensor=1,
                       expert_overlap=True)
    assert EXPERT_OVERLAP_WITH_TENSOR in _notes(folded)
    assert EXPERT_OVERLAP_WITH_TENSOR not in _notes(Execution(world=16, data="zero1", expert=16, expert_overlap=True))


def test_context_parallelism_says_it_is_timed_in_closed_form():
    """Context parallelism is not traced (search.plan.context): a plan ranking it says how it is
    timed, and which of Megatron-LM's schemes that is; a plan without it says nothing."""
    assert CONTEXT_PARALLEL in _notes(Execution(world=8, data="zero1", context=2, grad_accum=2))
    assert CONTEXT_PARALLEL in _notes(Execution(world=8, data="fsdp", shard=4, context=2))
    assert CONTEXT_PARALLEL not in _notes(Execution(world=8, data="zero1"))


def test_a_megatron_layout_planned_in_fp32_says_megatron_runs_16_bits():
    """Megatron-LM holds the model in 16 bits (--bf16): an fp32 plan (no --amp, no --dtype, or
    --dtype fp32 or fp64) of DDP or ZeRO-1 layouts, whose Megatron-LM arguments it writes, says
    how to time that; a 16-bit plan, or FSDP alone, does not."""
    fp32 = FP32_MEGATRON.format(dtype="fp32")
    for layout in (Execution(world=8, data="zero1"), Execution(world=8, data="ddp")):
        assert fp32 in _notes(layout)
        assert fp32 in _notes(layout, options=TraceOptions(dtype="fp32"))
        assert FP32_MEGATRON.format(dtype="fp64") in _notes(layout, options=TraceOptions(dtype="fp64"))
        for options in (TraceOptions(amp="bf16"), TraceOptions(dtype="bf16"), TraceOptions(amp="fp16")):
            assert not any(n.startswith("planned in") for n in _notes(layout, options=options))
    assert fp32 not in _notes(Execution(world=8, data="fsdp", shard=8))
