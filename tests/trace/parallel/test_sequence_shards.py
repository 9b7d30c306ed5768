"""Megatron-LM's sequence-parallel linears (``trace.parallel.sequence_shards``) on a DDP or
ZeRO-1 layout beside tensor parallelism: a block's column-parallel linears keep the rank's
sequence shard for backward, not the all-gathered input, and gather it once more in backward.
Checked against tensor parallelism alone (torchtitan's DTensor behaviour, which keeps the
gathered input) on the same per-rank batch, by hand: Megatron-LM's counts per block
(Korthikanti et al. 2022, section 4.2.2: the all-gather of each gathered input repeated in
backward), and the saved bytes of the two gathered inputs."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import run_ranks

from nnperf.layout import Execution
from nnperf.passes.memory.model import classify, saved_activations_by_module
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

pytestmark = pytest.mark.process

LLAMA = {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101}
BATCH, SEQ, TP = 2, 16, 2
GATHERED = BATCH * SEQ * LLAMA["dim"] * 4  # bytes of one gathered block input (fp32)


def _trace(execution: Execution):
    from nnperf.zoo import get_model

    return trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA),
                      TraceOptions(optimizer="adamw"), execution, lambda model: [])


def _saved_activations(traced) -> int:
    """Saved for backward by the blocks (the loss differs: Megatron-Core's cross entropy,
    ``test_vocab_parallel_loss``)."""
    by_module = saved_activations_by_module(traced.trace, classify(traced.trace))
    return sum(saved for module, saved in by_module.items() if module.removeprefix("module.").startswith("layers."))


def _block_all_gathers(traced, phase: str) -> list[int]:
    return [c.bytes for c in traced.collectives
            if c.kind == "all_gather" and c.phase == phase and c.module.removeprefix("module.").startswith("layers.")
            and c.group_ranks == (0, 1)]


@pytest.fixture(scope="module")
def traced():
    megatron = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    torchtitan = Execution(world=TP, tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    assert megatron.keeps_sequence_shards and not torchtitan.keeps_sequence_shards
    return _trace(megatron), _trace(torchtitan)


def test_each_gathered_input_is_gathered_again_in_backward(traced):
    megatron, torchtitan = traced
    blocks = LLAMA["n_layer"]
    # forward: attention's and the MLP's input gathered once each per block, either way
    assert _block_all_gathers(megatron, "forward") == _block_all_gathers(torchtitan, "forward") == [GATHERED] * 2 * blocks
    # backward: beside DTensor's all-gathers (of the reduce-scattered outputs' gradients),
    # Megatron-LM's of the two saved shards per block: q, k and v share one, the MLP's two
    # linears another
    plain = _block_all_gathers(torchtitan, "backward")
    assert sorted(_block_all_gathers(megatron, "backward")) == sorted(plain + [GATHERED] * 2 * blocks)


def test_the_linears_save_the_shard_not_the_gathered_input(traced):
    megatron, torchtitan = traced
    kept_less = _saved_activations(torchtitan) - _saved_activations(megatron)
    assert kept_less == LLAMA["n_layer"] * 2 * GATHERED * (TP - 1) // TP


def test_checkpointed_blocks_keep_their_own_policy():
    assert not Execution(world=4, data="ddp", tensor=2, sequence_parallel=True,
                         checkpoint="full").keeps_sequence_shards
    assert not Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True).keeps_sequence_shards


def test_megatrons_selective_recomputation_keeps_the_shards_too(traced):
    """Megatron-LM's --recompute-activations checkpoints the core attention alone
    (``search.memory_variants.CORE_ATTENTION``): its linears keep their shards and gather them
    again in backward exactly as without recomputation, and the blocks keep what they keep
    without it but the attention's log-sum-exp (fp32, one per query row of the rank's heads),
    which the recomputed attention makes again."""
    from nnperf.search.memory_variants import apply_checkpointing
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.zoo import get_model

    megatron, _ = traced
    execution = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=BATCH,
                          checkpoint="selective-attention")
    assert execution.keeps_sequence_shards
    recomputed = trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA),
                            TraceOptions(optimizer="adamw"), execution, repeated_blocks,
                            lambda w: apply_checkpointing(w, selective="selective-attention"))
    assert sorted(_block_all_gathers(recomputed, "backward")) == sorted(_block_all_gathers(megatron, "backward"))
    log_sum_exp = BATCH * (LLAMA["n_heads"] // TP) * SEQ * 4
    assert _saved_activations(megatron) - _saved_activations(recomputed) == LLAMA["n_layer"] * log_sum_exp


def _gradients_worker(rank: int) -> dict[str, dict[str, torch.Tensor]]:
    """One step of the tiny Llama on 2 gloo ranks, with DTensor's linears and with Megatron-LM's,
    for a micro-batch of one sample (the shard gathered in place) and of two (reordered)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from nnperf.trace.parallel.tensor import apply_tensor_parallel
    from nnperf.zoo import get_model

    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tensor",))
    grads = {}
    for batch in (1, 2):
        for keep in (False, True):
            torch.manual_seed(0)
            workload = get_model("llama-7b").build(batch=batch, seq_len=SEQ, **LLAMA)
            apply_tensor_parallel(workload.model, mesh["tensor"], True, loss_parallel=True, keep_shards=keep)
            torch.manual_seed(1)
            inputs = [torch.randint_like(x, LLAMA["vocab"]) for x in workload.inputs]
            with loss_parallel():
                workload.loss_fn(workload.model(*inputs)).backward()
            grads[f"{batch}-{keep}"] = {n: p.grad.full_tensor() for n, p in workload.model.named_parameters()}
    return grads


@pytest.mark.slow
def test_megatrons_linears_compute_dtensors_gradients():
    """The function ``nnperf measure`` runs on real GPUs: the same gradients as DTensor's own
    linears, every parameter, on both ranks."""
    for grads in run_ranks(_gradients_worker, TP, timeout_s=120).values():
        for batch in (1, 2):
            plain, megatron = grads[f"{batch}-False"], grads[f"{batch}-True"]
            assert plain.keys() == megatron.keys()
            for name in plain:
                torch.testing.assert_close(megatron[name], plain[name], msg=name)


@pytest.mark.parametrize("batch", [1, 2])
def test_the_gathered_shard_is_waited_for_after_the_input_gradient_gemm(batch):
    """Megatron-LM's order: all-gather issued, input-gradient GEMM, wait, weight-gradient GEMM
    (autograd's own ``mm`` computes the weight gradient first), whatever the micro-batch; the
    all-gather issued once backward has the block's row-parallel linear's input gradient."""
    from nnperf.zoo import get_model

    execution = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=batch)
    megatron = trace_rank(lambda: get_model("llama-7b").build(batch=batch, seq_len=SEQ, **LLAMA),
                          TraceOptions(optimizer="adamw"), execution, lambda model: [])
    events = megatron.trace.events
    gathers = {e.outputs[0].storage: e for e in events
               if e.phase == "backward" and e.name == "_c10d_functional.all_gather_into_tensor"}
    first_reads = {}
    for e in events:
        if e.name == "_c10d_functional.wait_tensor" and e.inputs[0].storage in gathers:
            first_reads.setdefault(e.inputs[0].storage, e)
    regathers = {s: w for s, w in first_reads.items() if w.module.rsplit(".", 1)[-1] in ("wv", "w3")}
    assert len(regathers) == 2 * LLAMA["n_layer"]
    for storage, wait in regathers.items():
        gather = gathers[storage]
        assert gather.module.rsplit(".", 1)[-1] in ("wo", "w2")
        between = [e for e in events[gather.index + 1:wait.index] if e.name == "aten.mm"]
        input_gradient = [e for e in between if e.module == wait.module]
        assert input_gradient and all(storage not in {m.storage for m in e.inputs} for e in between)
