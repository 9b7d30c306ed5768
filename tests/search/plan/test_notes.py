"""What a plan says besides its numbers (search.plan.notes): the notes on what layouts leave out."""

from __future__ import annotations

from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan.notes import DDP_HALF_PRECISION, MEGATRON_SEQUENCE_PARALLEL, notes
from nnperf.search.plan.results import Planned
from nnperf.trace.options import TraceOptions


def _notes(*executions: Execution, options: TraceOptions | None = None) -> list[str]:
    return notes(ModelRequest("llama-7b"), options or TraceOptions(), [Planned(e) for e in executions], None)


def test_megatrons_sequence_parallel_layouts_say_what_dtensor_saves_instead():
    """Only DDP or ZeRO-1 over two ranks or more beside sequence parallelism is Megatron-LM's
    layout; FSDP beside it is torchtitan's, whose DTensor saves what the trace saves, and tensor
    parallelism without sequence parallelism gathers nothing."""
    megatron = Execution(world=8, data="zero1", tensor=4, sequence_parallel=True)
    assert MEGATRON_SEQUENCE_PARALLEL in _notes(megatron, Execution(world=8, data="fsdp"))
    assert MEGATRON_SEQUENCE_PARALLEL in _notes(Execution(world=8, data="ddp", tensor=2, sequence_parallel=True))
    for other in (Execution(world=8, data="fsdp", tensor=4, sequence_parallel=True),
                  Execution(world=8, data="zero1", tensor=4, sequence_parallel=False),
                  Execution(world=4, data="ddp", tensor=4, sequence_parallel=True)):
        assert MEGATRON_SEQUENCE_PARALLEL not in _notes(other)


def test_ddp_of_a_16_bit_model_says_its_optimizer_has_no_fp32_copies():
    """ZeRO-1 keeps fp32 main parameters of a bf16 model, DDP (PyTorch's) does not: a plan with
    both says so; an --amp plan (fp32 weights) or one without DDP has nothing to say."""
    ddp = Execution(world=8, data="ddp")
    note = DDP_HALF_PRECISION.format(dtype="bf16")
    assert note in _notes(ddp, options=TraceOptions(dtype="bf16"))
    assert note not in _notes(ddp, options=TraceOptions(amp="bf16"))
    assert note not in _notes(Execution(world=8, data="zero1"), options=TraceOptions(dtype="bf16"))
