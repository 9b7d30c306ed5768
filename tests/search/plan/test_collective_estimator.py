"""Which collectives of a traced rank DeepEP times (``rank.collective_estimator``): a mixture of
experts' all-to-alls under ``token_dispatcher = "deepep"``, no other."""

from __future__ import annotations

from nnperf.hardware.cluster import load_cluster
from nnperf.kernels.collectives import estimate_collective
from nnperf.kernels.expert_dispatch import estimate_deduplicated
from nnperf.layout import Execution
from nnperf.search.plan.rank import collective_estimator
from nnperf.trace.collectives import Collective
from nnperf.trace.parallel.expert import routing_of
from nnperf.zoo.llama import build

GROUP = tuple(range(32))
SIZE = 2**26


def _all_to_all(module: str) -> Collective:
    return Collective(0, "all_to_all", SIZE, len(GROUP), GROUP, "forward", module)


def test_only_a_mixture_of_experts_all_to_all_is_deduplicated():
    cluster = load_cluster("dgx-h100")
    routing = {"module.layers.1.moe": (8, 128)}
    deepep = collective_estimator(cluster, Execution(world=64, data="zero1", expert=32, token_dispatcher="deepep"),
                                  routing)
    plain = estimate_collective("all_to_all", SIZE, GROUP, cluster).time_s
    assert deepep(_all_to_all("module.layers.1.moe.experts"), SIZE).time_s == \
        estimate_deduplicated(SIZE, GROUP, cluster, 8, 128).time_s
    assert deepep(_all_to_all("module.layers.1.moe"), SIZE).time_s < plain
    assert deepep(_all_to_all("module.layers.1.moed"), SIZE).time_s == plain  # another module
    alltoall = collective_estimator(cluster, Execution(world=64, data="zero1", expert=32), routing)
    assert alltoall(_all_to_all("module.layers.1.moe.experts"), SIZE).time_s == plain


def test_routing_is_read_off_the_model():
    workload = build(1, 16, dim=64, n_layer=2, n_heads=4, n_kv_heads=4, vocab=128, n_experts=8, top_k=2,
                     moe_hidden=32)
    assert routing_of(workload.model) == {"layers.0.moe": (2, 8), "layers.1.moe": (2, 8)}
