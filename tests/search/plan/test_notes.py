"""What a plan says besides its numbers (search.plan.notes): the notes on what layouts leave out."""

from __future__ import annotations

from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan.notes import MEGATRON_SEQUENCE_PARALLEL, notes
from nnperf.search.plan.results import Planned
from nnperf.trace.options import TraceOptions


def _notes(*executions: Execution) -> list[str]:
    return notes(ModelRequest("llama-7b"), TraceOptions(), [Planned(e) for e in executions], None)


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
