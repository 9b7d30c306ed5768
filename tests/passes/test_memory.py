"""Memory model: allocator rules and breakdowns checked against hand counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.passes.memory import (
    CachingAllocator,
    MemoryReport,
    predict_memory,
    round_size,
    segment_size,
)
from nnperf.request import ModelRequest
from nnperf.search.memory_variants import MemoryOptions, trace_memory
from nnperf.trace.blocks import repeated_blocks

MiB = 2**20


# -- allocator ---------------------------------------------------------------------------------
def test_round_size_is_512_byte_blocks():
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(4000) == 4096  # 8 blocks of 512


def test_segment_sizes_follow_the_two_pools():
    assert segment_size(1 * MiB) == 2 * MiB  # small pool
    assert segment_size(1 * MiB + 512) == 20 * MiB  # large pool, < 10 MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB  # rounded to 2 MiB beyond
    assert segment_size(11 * MiB) == 12 * MiB


def test_allocator_reuses_cached_blocks_and_keeps_segments():
    a = CachingAllocator()
    a.malloc("x", 1000)
    assert (a.allocated, a.reserved) == (1024, 2 * MiB)
    a.malloc("y", 3 * MiB)
    assert a.reserved == 22 * MiB
    a.free("y")
    assert a.reserved == 22 * MiB  # segments are not returned
    a.malloc("z", 2 * MiB)  # fits the cached 20 MiB segment
    assert a.reserved == 22 * MiB
    assert a.allocated == 1024 + 2 * MiB
    assert a.peak_allocated == 1024 + 3 * MiB


def test_unsplit_remainder_is_charged_to_the_block():
    a = CachingAllocator()
    a.malloc("big", 11 * MiB + MiB // 2)  # 12 MiB segment, 0.5 MiB left <= 1 MiB: not split
    assert a.allocated == 12 * MiB
    assert a.requested == 11 * MiB + MiB // 2


def test_freed_neighbours_merge():
    a = CachingAllocator()
    a.malloc("a", 4 * MiB)
    a.malloc("b", 4 * MiB)  # same 20 MiB segment
    a.free("a")
    a.free("b")
    a.malloc("c", 18 * MiB)  # needs the merged 20 MiB block
    assert a.segments == 1 and a.reserved == 20 * MiB


def test_a_side_streams_cached_blocks_serve_only_that_stream():
    """A segment belongs to the stream it was allocated for: the compute stream cannot reuse
    what an all-gather stream freed, but the all-gather stream can."""
    a = CachingAllocator()
    a.malloc("gathered", 12 * MiB, stream=1)  # a 12 MiB segment
    a.free("gathered")
    a.malloc("activation", 12 * MiB)  # the compute stream: a segment of its own
    assert (a.segments, a.reserved) == (2, 24 * MiB)
    a.malloc("gathered again", 12 * MiB, stream=1)  # the cached one
    assert (a.segments, a.reserved) == (2, 24 * MiB)


# -- hand-counted models -----------------------------------------------------------------------
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


P_MLP = 8 * 16 + 16 + 16 * 4 + 4  # 212 parameters


def test_mlp_adamw_model_states_are_4p_4p_8p():
    r = predict_memory(analyze(_mlp(), torch.randn(2, 8)).trace)
    # AdamW's 0-dim step counters live on the host with the foreach implementation
    assert r.model_states["parameters"] == 4 * P_MLP
    assert r.model_states["gradients"] == 4 * P_MLP
    assert r.model_states["optimizer_state"] == 8 * P_MLP


def test_fused_adamw_keeps_step_counters_on_the_device():
    r = predict_memory(analyze(_mlp(), torch.randn(2, 8), optimizer_impl="fused").trace)
    assert r.model_states["optimizer_state"] == 8 * P_MLP + 4 * 4  # + four fp32 step scalars


def test_sgd_has_no_optimizer_state():
    r = predict_memory(analyze(_mlp(), torch.randn(2, 8), optimizer="sgd").trace)
    assert r.model_states["optimizer_state"] == 0


@pytest.mark.parametrize("batch", [2, 32])
def test_mlp_saved_activations_by_hand(batch):
    r = predict_memory(analyze(_mlp(), torch.randn(batch, 8)).trace)
    # Linear(8,16) saves the input (an input, not an activation); ReLU saves its output
    # (B x 16 fp32), which the second Linear saves too (same storage); the pre-activation is
    # freed after ReLU. The output (B x 4) and the loss scalar stay alive until backward ends.
    assert r.saved_activations == {"1": 16 * 4 * batch, "2": 4 * 4 * batch, "(loss)": 4}


def test_cnn_saved_activations_by_hand():
    b = 4
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(4 * 4 * 4, 10))
    r = predict_memory(analyze(model, torch.randn(b, 3, 8, 8)).trace)
    relu_out = b * 4 * 8 * 8 * 4  # saved by ReLU and by max-pool (its input)
    pool_out = b * 4 * 4 * 4 * 4  # saved by Linear (through the flatten view)
    pool_idx = b * 4 * 4 * 4 * 8  # int64 indices saved by max-pool
    out = b * 10 * 4
    assert sum(r.saved_activations.values()) == relu_out + pool_out + pool_idx + out + 4
    assert r.saved_activations["1"] == relu_out
    assert r.saved_activations["2"] == pool_out + pool_idx


def test_peak_breakdown_adds_up_and_reserved_covers_allocated():
    r = predict_memory(analyze(_mlp(), torch.randn(64, 8)).trace)
    assert sum(r.breakdown.values()) == r.peak_allocated
    assert r.peak_reserved >= r.peak_allocated
    assert r.device_total > r.peak_reserved  # + CUDA context
    assert r.timeline and max(p.allocated for p in r.timeline) <= r.peak_allocated


def test_grad_accumulation_runs_forward_with_gradients_allocated():
    base = trace_memory(ModelRequest(_mlp(), inputs=(torch.randn(2, 8),)), MemoryOptions())[1]
    accum = trace_memory(ModelRequest(_mlp(), inputs=(torch.randn(2, 8),)),
                         MemoryOptions(grad_accum=4))[1]
    first_base = predict_memory(base).timeline[0].allocated
    first_accum = predict_memory(accum).timeline[0].allocated
    # four gradients of 512, 64, 256 and 16 bytes: one 512-byte block each
    assert first_accum - first_base == 4 * 512


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(2)
        )

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


def test_checkpointing_keeps_only_block_inputs():
    b = 16
    assert repeated_blocks(_Blocks()) == ["blocks.0", "blocks.1"]
    x = (torch.randn(b, 8),)
    plain = predict_memory(trace_memory(ModelRequest(_Blocks(), inputs=x), MemoryOptions())[1])
    ckpt = predict_memory(
        trace_memory(ModelRequest(_Blocks(), inputs=x), MemoryOptions(checkpoint=True))[1]
    )
    act = b * 8 * 4  # one B x 8 fp32 activation
    # plain: two ReLU outputs, block 0's output (block 1's input), the model output, the loss
    assert sum(plain.saved_activations.values()) == 4 * act + 4
    # checkpointed: block 1's input, the output, the loss (block 0's input is the batch)
    assert sum(ckpt.saved_activations.values()) == 2 * act + 4


def test_measured_peaks_compare_with_the_prediction(tmp_path):
    from nnperf.passes.memory import compare, load_measurements

    path = tmp_path / "measured.json"
    path.write_text('[{"model": "toy", "config": {"batch": 8}, "peak_allocated": 1000,'
                    ' "peak_reserved": 2000}]')
    [measured] = load_measurements(path)
    predicted = MemoryReport(source="predicted", model="toy", peak_allocated=1050,
                             peak_reserved=1900, device_total=3000)
    rows = {c.quantity: c for c in compare(predicted, measured)}
    assert rows["peak_allocated"].error == 0.05  # (1050 - 1000) / 1000
    assert rows["peak_reserved"].error == -0.05
    assert rows["device_total"].error is None  # not measured
