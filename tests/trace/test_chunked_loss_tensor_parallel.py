"""torchtitan's chunked loss with tensor parallelism (``trace.loss.ChunkedLoss`` over a
vocabulary split by ``ColwiseParallel``), run for real on 2 gloo ranks: its loss and every
parameter's gradient against plain eager cross entropy on the unsplit model in the same
process, with and without sequence parallelism, over uneven vocabulary slices and with ignored
targets; and the traced rank's collectives."""

from __future__ import annotations

import pytest
from gloo_ranks import run_ranks
from twin_models import twin_llamas

from nnperf.layout import Execution
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

pytestmark = pytest.mark.process

WORLD = 2
#: an odd vocabulary: the ranks' slices are uneven (33 and 32 rows, as torch.chunk splits it)
TINY = {"n_layer": 1, "dim": 16, "n_heads": 2, "n_kv_heads": 2, "ffn_hidden": 32, "vocab": 65}


def _worker(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from nnperf.trace.loss import ChunkedLoss
    from nnperf.trace.parallel.tensor import apply_tensor_parallel

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tensor",))
    out = {}
    for sp in (False, True):
        reference, split = twin_llamas(TINY)
        expected = reference.loss_fn(reference.model(*reference.inputs))
        expected.backward()
        apply_tensor_parallel(split.model, mesh, sequence_parallel=sp, loss_parallel=True)
        got = ChunkedLoss(split.loss_fn, split.model, chunks=4)(split.model(*reference.inputs))
        got.backward()
        worst = 0.0
        for p, q in zip(split.model.parameters(), reference.model.parameters(), strict=True):
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            worst = max(worst, (grad - q.grad).abs().max().item() / max(q.grad.abs().max().item(), 1e-12))
        loss = got.full_tensor() if hasattr(got, "full_tensor") else got
        out[sp] = (loss.item(), expected.item(), worst)
    return out


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_loss_and_gradients_match_eager_cross_entropy_on_every_rank(real_runs, sp):
    for rank in range(WORLD):
        loss, expected, worst = real_runs[rank][sp]
        assert loss == pytest.approx(expected, rel=1e-5)
        assert worst < 1e-4  # every parameter's whole gradient, relative to its largest entry


def test_the_traced_rank_reduces_three_numbers_per_token_of_each_chunk():
    """Per chunk three all-reduces over the vocabulary slices, as torchtitan's loss-parallel
    cross entropy runs them: the rows' maxima, their sums of exponentials and the picked
    log-probabilities, one fp32 per token of the chunk each."""
    from nnperf.zoo.llama import build

    tokens, chunks = 2 * 8, 8
    traced = trace_rank(lambda: build(2, 8, **TINY), TraceOptions(optimizer="sgd", loss="chunked"),
                        Execution(world=WORLD, tensor=WORLD, sequence_parallel=True), lambda model: ["layers.0"])
    loss_reduces = [c for c in traced.collectives if c.kind == "all_reduce" and c.bytes == tokens // chunks * 4]
    assert len(loss_reduces) == 3 * chunks
