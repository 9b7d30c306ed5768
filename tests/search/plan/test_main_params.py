"""Megatron-LM's DDP beside a 16-bit model holds fp32 main parameters and fp32 Adam moments
(``search.plan.main_params``): 12 bytes of optimizer state a parameter where PyTorch's optimizer
on the bf16 weights holds 4; a plan counted 4 and ranked layouts as fitting that would not."""

from __future__ import annotations

import pytest

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate, main_params
from nnperf.search.plan.rank import RoleCache
from nnperf.trace.options import TraceOptions

REQUEST = ModelRequest("llama-7b", batch=2, seq_len=128, overrides={
    "n_layer": 2, "dim": 256, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 512, "vocab": 1024})
BF16 = TraceOptions(dtype="bf16")


def _planned(execution: Execution, options: TraceOptions = BF16):
    return evaluate(REQUEST, options, execution, load_gpu("h100-sxm"), load_cluster("dgx-h100"), layers=2,
                    cache=RoleCache())


def test_ddp_beside_tensor_parallelism_holds_twelve_bytes_of_state_a_parameter(monkeypatch):
    """DDP x4 beside TP 2 (only Megatron-LM runs it): the optimizer state is 12 bytes a bf16
    parameter (fp32 main copy and two fp32 moments, Adam's step counters aside), and the peak
    is 8 bytes a parameter above PyTorch's bf16 optimizer's (counted without the rule)."""
    execution = Execution(world=8, data="ddp", tensor=2, sequence_parallel=True, micro_batch=1)
    planned = _planned(execution)
    elements = planned.state_bytes.parameters / 2
    assert planned.state_bytes.optimizer_state == pytest.approx(12 * elements, rel=1e-3)
    monkeypatch.setattr(main_params, "holds_main_params", lambda e, o: False)
    traced = _planned(execution)
    assert traced.state_bytes.optimizer_state == pytest.approx(4 * elements, rel=1e-3)
    assert planned.memory_bytes - traced.memory_bytes == pytest.approx(8 * elements, abs=1)


@pytest.mark.parametrize(("execution", "options"), [
    (Execution(world=8, data="ddp", micro_batch=1), BF16),  # DDP alone: torchtitan's, PyTorch's optimizer
    (Execution(world=8, data="ddp", tensor=2, sequence_parallel=True, micro_batch=1), TraceOptions(amp="bf16")),
    (Execution(world=8, data="zero1", tensor=2, sequence_parallel=True, micro_batch=1), BF16),  # traced itself
])
def test_layouts_whose_optimizer_the_trace_has_keep_its_states(execution, options):
    assert not main_params.holds_main_params(execution, options)


@pytest.mark.parametrize(("states", "fp32_gradients", "optimizer_bytes", "gradient_bytes"), [
    ("fp32", False, 12, 2),  # an fp32 main copy and fp32 moments
    ("bf16-moments", False, 8, 2),  # an fp32 main copy, bf16 moments
    ("bf16", False, 4, 2),  # bf16 moments, no main copy: as traced
    ("fp32", True, 12, 4),  # fp32 main gradients in place of the bf16 ones
])
def test_zero1_on_one_data_parallel_rank_holds_its_states_whole(states, fp32_gradients, optimizer_bytes,
                                                                 gradient_bytes):
    """ZeRO-1 over one data-parallel rank (TP 2 on 2 GPUs: NeMo's recipes keep the distributed
    optimizer at any degree) shards nothing: its states whole on the rank, in the dtypes asked,
    counted by hand per bf16 parameter; the same layout as Megatron-LM's DDP holds the same."""
    execution = Execution(world=2, data="zero1", tensor=2, sequence_parallel=True, micro_batch=1,
                          optimizer_states=states, grad_reduce_in_fp32=fp32_gradients)
    execution.validate()
    assert execution.megatron_layout and main_params.holds_main_params(execution, BF16)
    planned = _planned(execution)
    elements = planned.state_bytes.parameters / 2
    assert planned.state_bytes.optimizer_state == pytest.approx(optimizer_bytes * elements, rel=1e-3)
    assert planned.state_bytes.gradients == pytest.approx(gradient_bytes * elements, rel=1e-3)
    if states == "fp32" and not fp32_gradients:
        ddp = _planned(Execution(world=2, data="ddp", tensor=2, sequence_parallel=True, micro_batch=1,
                                 framework="megatron"))
        assert (ddp.memory_bytes, ddp.state_bytes) == (planned.memory_bytes, planned.state_bytes)
