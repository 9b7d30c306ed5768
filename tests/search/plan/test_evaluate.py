"""One layout through search.plan.evaluate: a pipeline whose stages cannot split the layers evenly
is refused for every caller, and its shortened first and last stages are modelled as asked (issue
37: a 10-layer GPT-2 on 4 stages gave exactly the 8-layer result)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nnperf.errors import UsageError
from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.rank import RoleCache
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model

GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
GPT2 = {"n_layer": 10, "n_embd": 64, "n_head": 2, "vocab": 256, "n_positions": 64}
OPTIONS = TraceOptions(amp="bf16")
FOUR = Execution(world=4, pipeline=4, pipeline_schedule="1f1b", micro_batch=1, grad_accum=4)


def test_ten_layers_on_four_even_stages_are_refused():
    request = ModelRequest("gpt2", batch=4, seq_len=32, overrides=GPT2)
    with pytest.raises(UsageError, match="10 layers do not split evenly into 4 pipeline stages"):
        evaluate(request, OPTIONS, FOUR, GPU, CLUSTER, layers=10, cache=RoleCache())


def test_shortened_first_and_last_stages_hold_every_block():
    """2, 3, 3 and 2 blocks: each rank's parameters are its blocks' (and the embeddings', the
    final norm's and the head's on the ends), counted here from the model itself, in fp32."""
    uneven = FOUR.__class__(**{**FOUR.__dict__, "first_stage_layers": 2, "last_stage_layers": 2})
    assert _parameter_bytes_per_rank(uneven, 10) == _expected_bytes(10, (2, 3, 3, 2))


def test_an_interleaved_end_stage_holds_its_blocks_in_each_of_its_chunks():
    """20 blocks, 4 stages x 2 chunks, end stages of 4: 2 + 2 blocks on rank 0 and rank 3, 3 + 3
    on the others. Rank 0's second chunk is a middle chunk of 2 blocks, not the 3 of the chunks
    between (a plan that timed every middle chunk at one depth gave rank 0 five blocks)."""
    uneven = Execution(world=4, pipeline=4, pipeline_schedule="interleaved-1f1b", virtual_stages=2, micro_batch=1,
                       grad_accum=4, first_stage_layers=4, last_stage_layers=4)
    assert _parameter_bytes_per_rank(uneven, 20) == _expected_bytes(20, (4, 6, 6, 4))


def test_an_end_chunk_of_the_embedding_or_the_head_alone():
    """6 blocks, 4 stages x 2 chunks, end stages of 1 block (Llama 3 405B's split in small):
    rank 0's first chunk holds the embeddings alone and rank 3's last the final norm and the
    head alone, so the ranks hold 1, 2, 2 and 1 blocks."""
    uneven = Execution(world=4, pipeline=4, pipeline_schedule="interleaved-1f1b", virtual_stages=2, micro_batch=1,
                       grad_accum=4, first_stage_layers=1, last_stage_layers=1)
    assert uneven.chunk_layers(6) == (0, 1, 1, 1, 1, 1, 1, 0)
    assert _parameter_bytes_per_rank(uneven, 6) == _expected_bytes(6, (1, 2, 2, 1))


DEEPSEEK = {"n_layer": 6, "n_dense_layers": 3, "dim": 64, "n_heads": 4, "kv_lora": 32, "qk_nope_dim": 16,
            "qk_rope_dim": 8, "v_head_dim": 16, "ffn_hidden": 128, "n_experts": 4, "top_k": 2, "moe_hidden": 32,
            "vocab": 128}


def _deepseek_bytes_per_rank(execution: Execution, layers: int) -> tuple[dict[int, float], Any, int, int]:
    """The plan's parameter bytes of each rank of a DeepSeek of ``layers`` blocks (3 dense, EP 2
    over the 2 data-parallel ranks), the model, and a dense and an expert block's fp32 bytes on
    one rank (half of the experts)."""
    request = ModelRequest("deepseek-v3-16b", batch=3, seq_len=32, overrides={**DEEPSEEK, "n_layer": layers})
    planned = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=layers, cache=RoleCache())
    with torch.device("meta"):
        model = get_model("deepseek-v3-16b").build(batch=1, seq_len=32, **{**DEEPSEEK, "n_layer": layers}).model
    dense = _size(model.layers[0])
    moe = _size(model.layers[-1]) - _size(model.layers[-1].moe.experts) // 2
    return planned.pipeline.parameter_bytes_per_rank, model, dense, moe


def _size(*modules) -> int:
    return 4 * sum(p.numel() for m in modules for p in m.parameters())


def test_a_pipeline_rank_of_dense_blocks_only_plans_expert_parallelism():
    """DeepSeek-V3's 3 dense blocks before its experts, 6 blocks on 3 stages (traced whole):
    rank 0 holds the embedding and 2 dense blocks, rank 1 a dense and an expert block, rank 2
    two expert blocks, the final norm and the head. Rank 0 has no experts of its own: expert
    parallelism was refused there as "needs a mixture-of-experts model"."""
    execution = Execution(world=6, data="zero1", pipeline=3, pipeline_schedule="1f1b", expert=2, micro_batch=1,
                          grad_accum=3)
    per_rank, model, dense, moe = _deepseek_bytes_per_rank(execution, 6)
    assert per_rank == {0: _size(model.tok_embeddings) + 2 * dense, 1: dense + moe,
                        2: 2 * moe + _size(model.norm, model.output)}


def test_leading_dense_blocks_stay_in_the_first_chunk_of_a_shallow_trace():
    """8 blocks on 2 stages x 2 chunks of 2, planned from a trace of 3 chunks of 2 blocks (its
    roles): that trace keeps 2 of the 3 dense blocks, those of the first chunk, so its middle
    chunk stands for the expert chunks of a deep stack (DeepSeek-V3 671B's 30 of 31 on 8 x 4
    chunks) instead of holding a dense block it would push there, or, for chunks of 1 block, no
    experts in the trace at all. Rank 0 (chunks 0 and 2: 2 dense, then 2 expert blocks) is
    exact; rank 1's chunk of a dense and an expert block is planned as 2 expert blocks."""
    execution = Execution(world=4, data="zero1", pipeline=2, pipeline_schedule="interleaved-1f1b", virtual_stages=2,
                          expert=2, micro_batch=1, grad_accum=2)
    per_rank, model, dense, moe = _deepseek_bytes_per_rank(execution, 8)
    assert per_rank == {0: _size(model.tok_embeddings) + 2 * dense + 2 * moe,
                        1: 4 * moe + _size(model.norm, model.output)}


def _parameter_bytes_per_rank(execution: Execution, layers: int) -> dict[int, float]:
    """The plan's parameter bytes of each pipeline rank of a GPT-2 of ``layers`` blocks."""
    request = ModelRequest("gpt2", batch=4, seq_len=32, overrides={**GPT2, "n_layer": layers})
    planned = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=layers, cache=RoleCache())
    assert planned.fits and planned.step_s > 0
    return planned.pipeline.parameter_bytes_per_rank


def _expected_bytes(layers: int, blocks: tuple[int, ...]) -> dict[int, int]:
    """Each rank's fp32 parameter bytes counted from the model: ``blocks[r]`` blocks, the
    embeddings on the first rank, the final norm and the (untied) head on the last."""
    with torch.device("meta"):
        model = get_model("gpt2").build(batch=1, seq_len=32, **{**GPT2, "n_layer": layers}).model

    def size(*modules):
        return 4 * sum(p.numel() for m in modules for p in m.parameters())

    out = {r: n * size(model.h[0]) for r, n in enumerate(blocks)}
    out[0] += size(model.wte, model.wpe)
    out[len(blocks) - 1] += size(model.ln_f) + 4 * model.lm_head.weight.numel()
    return out


def _contended() -> object:
    """A cluster whose collectives are slow and hold most of the SMs: a reduction beside the
    backward stretches its kernels by far more than the tolerance of the tests below."""
    from dataclasses import replace

    slow = replace(CLUSTER.intra, link_bytes_per_s=2e9, nvls_busbw=0.0, collective_ctas=100)
    return replace(CLUSTER, intra=slow)


LLAMA = {"n_layer": 4, "dim": 2048, "n_heads": 16, "ffn_hidden": 5632, "vocab": 512}  # kernels, not the host, bound the step


def _ddp_steps(data_parallel: int, context: int = 1, data: str = "ddp", clip: float | None = None) -> tuple:
    """One and four micro-batches of ``data`` over ``data_parallel`` ranks (each of ``context``
    GPUs) on the contended cluster, the gradients clipped to ``clip``."""
    cluster = _contended()
    request = ModelRequest("llama-7b", batch=2, seq_len=2048, overrides=LLAMA)
    options = TraceOptions(amp="bf16", clip_grad_norm=clip)

    def step(accum: int):
        execution = Execution(world=data_parallel * context, data=data, context=context, micro_batch=2,
                              grad_accum=accum)
        return evaluate(request, options, execution, GPU, cluster, layers=4, cache=RoleCache())

    return step(1), step(4)


@pytest.mark.parametrize(("data", "clip"), [("ddp", None), ("zero1", None), ("zero1", 1.0)])
def test_ddp_accumulating_reduces_once_per_step(data, clip):
    """DDP (ZeRO-1 on it, with and without clipping) over 2 GPUs accumulating 4 micro-batches:
    the 3 micro-batches under ``no_sync`` neither wait for the gradients' reduction nor run
    beside it, so 4 micro-batches take 3 of one GPU's micro-batches longer than 1 does, as
    without data parallelism (within 3%: DDP's hooks still cost the host); the exposed reduction
    is the same once-per-step wait, within the step. (Timed as the traced micro-batch, the step
    grew by 3 reductions; ZeRO-1's wait, which lands on the first op of the clipping or the
    update, stayed in every micro-batch.)"""
    one, four = _ddp_steps(2, data=data, clip=clip)
    plain_one, plain_four = _ddp_steps(1, clip=clip)
    kind = "all_reduce" if data == "ddp" else "reduce_scatter"
    wait = one.split.exposed_communication_s[kind]
    assert wait > 0.3 * one.step_s  # the reduction is much of the step
    assert four.step_s - one.step_s == pytest.approx(plain_four.step_s - plain_one.step_s, rel=0.03)
    assert four.split.exposed_communication_s[kind] == pytest.approx(wait)
    assert sum(four.split.exposed_communication_s.values()) <= four.step_s


MIXTURE = {"n_layer": 2, "dim": 512, "n_heads": 8, "ffn_hidden": 1024, "n_experts": 8, "top_k": 2,
           "moe_hidden": 512, "vocab": 512}


@pytest.mark.parametrize("expert", [4, 2])
def test_expert_all_to_alls_run_in_every_accumulated_micro_batch(expert):
    """ZeRO-1 over 4 GPUs with expert parallelism over all 4 (the expert group is then the
    default group, as the data-parallel one is) or over 2: each micro-batch sends its tokens to
    their experts and back, so 4 accumulated micro-batches wait 4 times as long for the
    all-to-alls as 1 does, and the step grows by at least 3 of them. (Planned as the
    data-parallel engine's once-per-step reduction because they shared its group, EP over
    every rank waited for them once a step: Qwen3-30B on 16 H100s, EP 16, came out 40% fast.)"""
    request = ModelRequest("llama-7b", batch=2, seq_len=1024, overrides=MIXTURE)

    def step(accum: int):
        execution = Execution(world=4, data="zero1", expert=expert, micro_batch=2, grad_accum=accum)
        return evaluate(request, OPTIONS, execution, GPU, _contended(), layers=2, cache=RoleCache())

    one, four = step(1), step(4)
    wait = one.split.exposed_communication_s["all_to_all"]
    assert wait > 0
    assert four.split.exposed_communication_s["all_to_all"] == pytest.approx(4 * wait, rel=1e-6)
    assert four.step_s - one.step_s >= 3 * wait


def test_the_broadcast_of_the_wrapped_models_buffers_stays_once_per_step():
    """A DeepSeek-V3 of 2 blocks (its MoE's load-balancing buffers, expert_bias and
    tokens_per_expert, broadcast from rank 0 as DDP wraps it), ZeRO-1 and EP over both GPUs:
    4 micro-batches wait for that broadcast as long as 1 does, and for their all-to-alls 4
    times as long."""
    request = ModelRequest("deepseek-v3-16b", batch=2, seq_len=2048, overrides={**DEEPSEEK, "n_layer": 2,
                                                                                   "n_dense_layers": 1})

    def step(accum: int):
        execution = Execution(world=2, data="zero1", expert=2, micro_batch=2, grad_accum=accum)
        return evaluate(request, OPTIONS, execution, GPU, _contended(), layers=2, cache=RoleCache())

    one, four = step(1), step(4)
    assert one.collectives["broadcast"].count == 1
    broadcast = one.split.exposed_communication_s["broadcast"]
    assert broadcast > 0
    assert four.split.exposed_communication_s["broadcast"] == pytest.approx(broadcast)
    assert four.split.exposed_communication_s["all_to_all"] == pytest.approx(
        4 * one.split.exposed_communication_s["all_to_all"], rel=1e-6)


def test_ddp_beside_context_parallelism_reduces_once_per_step():
    """The same beside context parallelism (2 GPUs share each sequence; DDP over the 4 reduces
    the gradients): the all-reduce's wait is the step's once, and each further micro-batch adds
    less than the traced one without it (its ring attention's exchange added each time)."""
    one, four = _ddp_steps(2, context=2)
    wait = one.split.exposed_communication_s["all_reduce"]
    assert wait > 0.5 * one.step_s
    assert four.split.exposed_communication_s["all_reduce"] == pytest.approx(wait)
    assert 0 < four.step_s - one.step_s < 3 * (one.step_s - wait)


def test_a_pipeline_backward_is_not_stretched_by_the_once_per_step_reduction():
    """3 stages, DDP over 2 ranks per stage, on links slow enough that the gradients' all-reduce
    runs beside most of the traced backward holding most of the SMs: the backward action is the
    one ``no_sync`` runs, as without data parallelism (within 3%), every micro-batch's but the
    last; the stretch goes to the step's tail with the reduction."""
    from nnperf.search.plan.rank import scaled_cost

    cluster = _contended()
    request = ModelRequest("llama-7b", batch=2, seq_len=2048, overrides={**LLAMA, "n_layer": 12})
    ddp = Execution(world=6, data="ddp", pipeline=3, pipeline_schedule="gpipe", micro_batch=2)
    alone = Execution(world=3, data="ddp", pipeline=3, pipeline_schedule="gpipe", micro_batch=2)
    with_ddp = scaled_cost(request, OPTIONS, ddp, GPU, cluster, 0, 12, RoleCache(), per_chunk=4).figures
    plain = scaled_cost(request, OPTIONS, alone, GPU, cluster, 0, 12, RoleCache(), per_chunk=4).figures
    assert with_ddp.sync_slowdown_s > 0.1 * plain.action("B", 0)  # the stretch the test is about
    assert with_ddp.action("B", 0) == pytest.approx(plain.action("B", 0), rel=0.03)


def test_a_pipeline_given_no_depth_splits_the_models_own_blocks():
    """Without ``layers`` a pipeline reads the stack's depth off the model: 8 blocks on 2
    stages are 4 a stage, each rank's parameters counted from the model (a caller that named
    the model alone was refused: its 8 blocks traced whole over the 3 stages roles are traced
    on, "8 layers do not split evenly into 3 pipeline stages")."""
    two = Execution(world=2, pipeline=2, pipeline_schedule="1f1b", micro_batch=1, grad_accum=2)
    request = ModelRequest("gpt2", batch=2, seq_len=32, overrides={**GPT2, "n_layer": 8})
    planned = evaluate(request, OPTIONS, two, GPU, CLUSTER, cache=RoleCache())
    assert planned.pipeline.parameter_bytes_per_rank == _expected_bytes(8, (4, 4))


def test_an_fsdp_and_tensor_parallel_fp16_plan_prints_no_dtensor_warning(caplog):
    """fp16's GradScaler reads its found-inf flag, a ``Partial(max)`` over the data x tensor mesh,
    which DTensor reduces one dimension at a time and warns about on stderr (OPT-175B's layout
    printed it mid-plan); the trace records both all-reduces and the warning says nothing."""
    request = ModelRequest("gpt2", batch=2, seq_len=32, overrides={**GPT2, "n_layer": 2, "n_head": 8})
    layout = Execution(world=32, data="fsdp", tensor=8, micro_batch=2)
    options = TraceOptions(amp="fp16", clip_grad_norm=1.0)
    planned = evaluate(request, options, layout, GPU, CLUSTER, layers=2, cache=RoleCache())
    assert planned.step_s > 0
    assert not [r for r in caplog.records if r.name.startswith("torch.distributed.tensor")]
