"""The saved activations of a traced pipeline stage that are its transfers between stages.

A stage traced for one micro-batch with torch's ``PipelineStage`` keeps three tensors from its
forward into its backward that the pipeline engines hold differently per micro-batch:

- the buffer its input is received into (not the first stage): the stage's input, saved by its
  first block; every engine keeps it while the micro-batch is in flight;
- the buffer the gradient of its output will be received into (not the last stage): torch
  allocates one per micro-batch of the step, with the activation's, when the schedule first
  runs (``PipelineStage._setup_forward_recv_info`` and ``_create_grad_recv_info``), and keeps
  them for the whole step and the next; Megatron-LM allocates it when the gradient arrives
  (``p2p_communication._communicate``), so it is alive in one backward only;
- the output it sent (not the last stage): torch keeps it for its backward (``fwd_cache``);
  Megatron-LM frees its data right after the send and keeps only its autograd node
  (``deallocate_output_tensor``, with ``deallocate_pipeline_outputs``, which its training loop
  sets).

``search.plan.pipeline`` counts them per micro-batch in flight, per step, or not at all, as the
layout's engine does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nnperf.passes.memory.model import classify
from nnperf.trace.events import Trace
from nnperf.vocab import MemoryCategory, Phase

_RECEIVE, _SEND = "c10d.recv_", "c10d.send"


@dataclass(frozen=True)
class TransferBytes:
    """Bytes of a stage's saved activations that are transfers (module docstring), for the
    micro-batches its trace ran."""

    received_activations: float = 0.0
    received_gradients: float = 0.0
    sent_activations: float = 0.0

    @property
    def received(self) -> float:
        """Both receive buffers: what torch holds for every micro-batch of the step."""
        return self.received_activations + self.received_gradients


def saved_transfers(trace: Trace, actions: Sequence[tuple[str, int, int]]) -> TransferBytes:
    """The saved activations of ``trace`` that its stage received or sent, each storage once.

    ``actions``: the schedule's actions as the trace recorded them (label, first event, end).
    A receive is the one of the action it comes before (a schedule posts the receives of an
    action right before it): of a forward (``F``) an activation, of a backward a gradient.
    The phase of the event cannot tell them apart: torch posts the first backward's receive
    before autograd starts."""
    saved = {sid for sid, role in classify(trace).items()
             if role.on_device and role.category == MemoryCategory.SAVED_ACTIVATIONS}
    starts = sorted((start, label[0]) for label, start, _ in actions)

    def next_action(index: int) -> str:
        return next((kind for start, kind in starts if start > index), "")

    activations: set[int] = set()
    gradients: set[int] = set()
    sent: set[int] = set()
    for event in trace.events:
        if event.name == _RECEIVE:
            into = activations if next_action(event.index) == "F" else gradients
            into.update(m.storage for m in event.inputs if m.storage in saved)
        elif event.name == _SEND and event.phase == Phase.FORWARD:
            sent.update(m.storage for m in event.inputs if m.storage in saved)

    def nbytes(storages: set[int]) -> float:
        return float(sum(trace.storages[s].nbytes for s in storages))

    return TransferBytes(nbytes(activations), nbytes(gradients), nbytes(sent))
