"""The model-state bound of HSDP and DDP layouts from their FSDP sibling (search.plan.states)
against the layouts traced: at most their traced state bytes and memory; and the search skips
a layout whose bound cannot fit, tracing FSDP only."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.rank import RoleCache
from nnperf.search.plan.search import _search
from nnperf.search.plan.states import states_bound
from nnperf.trace.options import TraceOptions

GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
# wide and shallow: model states dominate the memory
WIDE = {"dim": 1024, "n_heads": 8, "ffn_hidden": 4096, "vocab": 8192, "n_layer": 2}
REQUEST = ModelRequest("llama-7b", batch=1, seq_len=16, overrides=WIDE)


@pytest.mark.parametrize(("tensor", "optimizer"), [(1, "adamw"), (2, "adamw"), (1, "sgd-momentum")])
def test_the_bound_is_below_the_traced_states(tensor, optimizer):
    options = TraceOptions(amp="bf16", optimizer=optimizer)
    fsdp = Execution(world=8, data="fsdp", shard=8 // tensor, tensor=tensor, sequence_parallel=tensor > 1)
    sibling = evaluate(REQUEST, options, fsdp, GPU, CLUSTER)
    others = [Execution(world=8, data="hsdp", shard=2, tensor=tensor, sequence_parallel=tensor > 1)]
    if tensor == 1:
        others.append(Execution(world=8, data="ddp"))
    for execution in others:
        bound = states_bound(sibling, fsdp.shard, execution, optimizer)
        traced = evaluate(REQUEST, options, execution, GPU, CLUSTER)
        states = traced.state_bytes.total
        assert bound is not None and 0.9 * states < bound <= states <= traced.memory_bytes, execution.describe()


@pytest.mark.parametrize("data", ["ddp", "zero1"])
def test_with_experts_the_bound_is_below_the_traced_states(data):
    """Expert parallelism 2 of 4 experts on 8 GPUs: the FSDP sibling shards the experts over all
    8 ranks, a DDP / ZeRO-1 rank holds 2 of them whole; the bound stays below what is traced."""
    options = TraceOptions(amp="bf16")
    request = ModelRequest("llama-7b", batch=1, seq_len=16, overrides={**WIDE, "n_experts": 4, "top_k": 2})
    fsdp = Execution(world=8, data="fsdp", shard=8, expert=2)
    sibling = evaluate(request, options, fsdp, GPU, CLUSTER)
    execution = Execution(world=8, data=data, expert=2)
    bound = states_bound(sibling, fsdp.shard, execution, "adamw")
    traced = evaluate(request, options, execution, GPU, CLUSTER)
    assert bound is not None and 0 < bound <= traced.state_bytes.total <= traced.memory_bytes


def test_the_search_skips_hsdp_whose_states_cannot_fit():
    request = ModelRequest("llama-7b", batch=1, seq_len=16, overrides={**WIDE, "dim": 2048, "ffn_hidden": 8192, "n_layer": 8})
    options = TraceOptions(amp="bf16")
    fsdp = Execution(world=8, data="fsdp", shard=8)
    hsdp = Execution(world=8, data="hsdp", shard=2)
    sibling = evaluate(request, options, fsdp, GPU, CLUSTER)
    bound = states_bound(sibling, 8, hsdp, "adamw")
    assert sibling.memory_bytes < bound
    gpu = load_gpu("h100", overrides={"memory_gib": str((sibling.memory_bytes + bound) / 2 / 2**30)})
    cache = RoleCache()
    results = _search(request, options, [fsdp, hsdp], gpu, CLUSTER, None, cache)
    assert cache.traces == 1  # FSDP's
    fitted, skipped = results
    assert fitted.fits and fitted.execution == fsdp
    assert not skipped.fits and skipped.memory_bound and skipped.memory_bytes == bound
    assert skipped.memory_bytes <= evaluate(request, options, hsdp, gpu, CLUSTER).memory_bytes


@pytest.mark.parametrize("data", ["fsdp", "ddp"])
def test_with_accumulation_the_optimizer_runs_once_in_every_part_of_the_split(data):
    """A micro-batch's compute and host time repeat per micro-batch; the optimizer's do not, in
    the step nor in its split (the split once summed compute x accumulation, optimizer included,
    and came out longer than the step)."""
    gpu = load_gpu("h100-sxm")
    cluster = load_cluster("dgx-h100")
    request = ModelRequest("gpt2", batch=2, seq_len=64,
                           overrides={"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab": 512, "n_positions": 64})
    options = TraceOptions(amp="bf16")
    shard = 2 if data == "fsdp" else 1
    one = evaluate(request, options, Execution(world=2, data=data, shard=shard, micro_batch=2), gpu, cluster)
    four = evaluate(request, options, Execution(world=2, data=data, shard=shard, micro_batch=2, grad_accum=4),
                    gpu, cluster)
    exposed = four.split.exposed_s
    assert four.split.compute_s + exposed <= four.step_s * (1 + 1e-9)
    assert four.split.compute_s < 4 * one.split.compute_s  # the optimizer's kernels once, not 4x
    assert four.split.host_s < 4 * one.split.host_s


def test_nothing_fits_names_only_remedies_not_already_in_use():
    from nnperf.search.plan.notes import _remedies

    used = _remedies(TraceOptions(amp="bf16", optimizer="adamw"), Execution(world=1, data="fsdp", shard=1))
    assert used[0] == "more GPUs to shard over" and "tensor/pipeline parallelism" in used
    assert not any("bf16" in r or "micro-batch" in r for r in used)  # both already given
    assert any("--optimizer sgd" in r for r in used)  # AdamW's two fp32 moments
    fresh = _remedies(TraceOptions(optimizer="sgd"),
                      Execution(world=2, data="fsdp", shard=1, tensor=2, sequence_parallel=True, micro_batch=4))
    assert fresh == ["more GPUs to shard over", "a smaller micro-batch", "bf16 (--amp bf16)"]


def test_activation_checkpointing_is_named_where_activations_outweigh_the_state():
    """Kept from checkpointing (``--checkpoint none``), a smallest layout that holds more beside
    its parameters, gradients and optimizer state than they take gets full checkpointing named,
    with both sizes; not one that checkpoints whole already, one whose state is the larger, or a
    bound (not traced: what it holds beside its state is not known)."""
    from dataclasses import replace

    from nnperf.search.plan.notes import _beside_state, _remedies
    from nnperf.search.plan.results import Planned, StateBytes

    gib = 2**30
    planned = Planned(Execution(world=16, data="zero1", tensor=8, sequence_parallel=True), memory_bytes=100 * gib,
                      context_bytes=gib, state_bytes=StateBytes(parameters=4 * gib, gradients=4 * gib,
                                                                optimizer_state=3 * gib))
    assert _beside_state(planned) == (88 * gib, 11 * gib)  # 100 - 1 of context - (4 + 4 + 3)
    options = TraceOptions(dtype="bf16")
    assert ("activation checkpointing (--checkpoint full): it holds 88.0 GiB of activations and working memory "
            "beside 11.0 GiB of parameters, gradients and optimizer state"
            in _remedies(options, planned.execution, beside_state=_beside_state(planned)))
    full = replace(planned.execution, checkpoint="full")
    assert not any("--checkpoint" in r for r in _remedies(options, full, beside_state=(88 * gib, 11 * gib)))
    assert not any("--checkpoint" in r for r in _remedies(options, planned.execution, beside_state=(5 * gib, 11 * gib)))
    assert _beside_state(replace(planned, memory_bound="parameters and optimizer state")) is None


def test_the_reserved_peak_is_the_device_total_less_the_cuda_context():
    """What training frameworks log as memory (torch.cuda.max_memory_reserved()) is the plan's
    device total without the CUDA context outside the caching allocator."""
    from nnperf.passes.memory.device import context_bytes

    planned = evaluate(REQUEST, TraceOptions(amp="bf16"), Execution(world=2, data="fsdp", shard=2), GPU, CLUSTER)
    doc = planned.to_json()
    assert doc["memory_bytes"] - doc["reserved_bytes"] == context_bytes(GPU.architecture) > 0


def test_an_eager_loss_that_keeps_gibibytes_is_named_as_a_remedy():
    from nnperf.search.plan.notes import _remedies

    fsdp = Execution(world=2, data="fsdp", shard=2)
    tokens, vocab = 16, WIDE["vocab"]
    eager = evaluate(REQUEST, TraceOptions(amp="bf16"), fsdp, GPU, CLUSTER)
    # under CUDA autocast: log_softmax in bf16 and NLL's fp32 copy of it, plus two 0-d fp32
    assert eager.loss_saved_bytes == tokens * vocab * (2 + 4) + 8
    compiled = evaluate(REQUEST, TraceOptions(amp="bf16", loss="compiled"), fsdp, GPU, CLUSTER)
    assert compiled.loss_saved_bytes == 2 * tokens * 4 + 8  # row max and log-sum, count and loss
    remedies = _remedies(TraceOptions(amp="bf16"), fsdp, loss_saved=3 * 2**30)
    assert any("--loss compiled" in r and "3.0 GiB" in r for r in remedies)
    assert not any("--loss" in r for r in _remedies(TraceOptions(amp="bf16", loss="compiled"), fsdp, 3 * 2**30))
    assert not any("--loss" in r for r in _remedies(TraceOptions(amp="bf16"), fsdp, eager.loss_saved_bytes))
    # Megatron-Core's fused loss is its own: torchtitan's losses are no remedy beside it
    fused = Execution(world=2, data="zero1", loss_fusion=True)
    assert not any("--loss" in r for r in _remedies(TraceOptions(amp="bf16"), fused, 3 * 2**30))


def test_a_chunked_loss_plans_tensor_splits_and_pipelines():
    """An eager inner cross entropy runs over a split vocabulary (torchtitan's loss-parallel
    one) and on a pipeline's last stage; a compiled one over a split vocabulary is not
    modelled: one tensor degree, and a degree asked for is one line."""
    from nnperf.search.plan.axes import chunked_loss_axes

    chunked = TraceOptions(amp="bf16", loss="chunked")
    assert chunked_loss_axes(chunked, None, None) == (None, None)  # auto: every degree
    assert chunked_loss_axes(chunked, [1, 2], [1, 2]) == ([1, 2], [1, 2])
    compiled = TraceOptions(amp="bf16", loss="chunked-compiled")
    assert chunked_loss_axes(compiled, None, [1, 4]) == ([1], [1, 4])
    with pytest.raises(UsageError, match="--loss chunked-compiled with --tp 2 is not modelled"):
        chunked_loss_axes(compiled, [2], None)
