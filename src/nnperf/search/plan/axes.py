"""What a plan searches, by the model's and the GPUs' rules: the tensor, pipeline and expert
degrees to try (what the user gave, checked: a degree that cannot hold is one line naming the
valid ones), and the facts of a built-in model they are checked against (``model_info``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from nnperf.errors import UsageError
from nnperf.layout import DEFAULT_SCHEDULES, PIPELINE_DEGREES, SCHEDULES, split_layers
from nnperf.request import ModelRequest
from nnperf.search.plan.layouts import PipelineSplitChoice, fills_nodes
from nnperf.search.plan.rank import SCALE_POINTS, leading_dense_blocks
from nnperf.trace.options import TraceOptions


def request_name(request: ModelRequest) -> str:
    return request.target if isinstance(request.target, str) else type(request.target).__name__


def search_axes(request: ModelRequest, gpus: int, nodes_of: int, layers: int | None,
                tensor: Iterable[int] | None, pipeline: Iterable[int] | None,
                model_info: tuple[Any, dict[str, Any], int | None] | None,
                split: PipelineSplitChoice | None = None,
                schedules: Iterable[str] = DEFAULT_SCHEDULES,
                context: Iterable[int] = (1,)) -> tuple[list[int], list[int]]:
    """The tensor and pipeline degrees to try: what the user gave (checked: a degree that does
    not divide the model is one line), else every degree the model and the nodes allow.
    ``model_info``: ``model_info(request, layers)``; ``split``: an uneven first and last stage
    the pipelines must hold with one of ``schedules``; ``context``: the context degrees, which
    with one tensor degree fix the GPUs a pipeline degree must divide."""
    split = split or PipelineSplitChoice()

    if tensor is not None:
        tensor = list(tensor)
        for tp in tensor:
            if tp > 1 and model_info is None:
                raise UsageError(f"--tp {tp}: {NO_PLANS.format(name=request_name(request))}; give --tp 1")
            if tp > 1:
                from nnperf.trace.parallel.tensor import check_divisible

                check_divisible(model_info[0], model_info[1], tp, True, request.seq_len or model_info[2])
    elif model_info is None:
        tensor = [1]
    else:
        from nnperf.trace.parallel.tensor import valid_degrees

        try:
            tensor = valid_degrees(model_info[0], model_info[1], True, request.seq_len or model_info[2],
                                   min(nodes_of, gpus))
        except UsageError:
            tensor = [1]  # no tensor-parallel plan for this model
        tensor = [d for d in tensor if nodes_of % d == 0 and d & (d - 1) == 0]
    if pipeline is not None:
        pipeline = list(pipeline)
        for pp in pipeline:
            if pp > 1:
                if layers is None:
                    raise UsageError("pipeline parallelism needs a built-in gpt2 or llama model (a stage split)")
                split.check(layers, pp, schedules, *_pipeline_room(gpus, tensor, context))  # one line
    elif layers is None or model_info is None or not _pipelines(model_info[0]):
        pipeline = [1]
    else:
        pipeline = [p for p in PIPELINE_DEGREES if p <= gpus and p < layers and split.holds_any(layers, p, schedules)]
    if split.first is not None or split.last is not None:
        if not any(p > 1 for p in pipeline):
            raise UsageError("--first-stage-layers/--last-stage-layers shorten pipeline stages: give --pp 2 or more "
                             "(a built-in gpt2 or llama model)")
        pipeline = [p for p in pipeline if p > 1]  # an uneven split is a pipeline's
    return tensor, pipeline


def _pipeline_room(gpus: int, tensor: list[int], context: Iterable[int]) -> tuple[int, str]:
    """The GPUs a pipeline degree must divide, and how to say so: those one tensor and one
    context degree leave of ``gpus`` ("with --tp 8 on 48 GPUs"), else all of them."""
    context = list(context)
    fixed = [(name, d[0]) for name, d in (("tp", tensor), ("cp", context)) if len(d) == 1 and d[0] > 1]
    taken = math.prod(d for _, d in fixed)
    if len(tensor) != 1 or len(context) != 1 or taken == 1 or gpus % taken:
        return gpus, f"on {gpus} GPUs"
    return gpus // taken, f"with {' '.join(f'--{name} {d}' for name, d in fixed)} on {gpus} GPUs"


def check_virtual_stages(layers: int | None, pipeline: Iterable[int], schedules: Iterable[str],
                         split: PipelineSplitChoice) -> None:
    """Virtual stages the user asked for (``--vpp``) must split each pipeline degree's stages:
    one line naming the valid counts otherwise."""
    if layers is None or not any(SCHEDULES[s].multi_chunk for s in schedules):
        return
    for pp in pipeline:
        if pp > 1:
            for virtual in split.virtual:
                if virtual < 2:
                    raise UsageError(f"--vpp {virtual}: interleaved schedules run 2 or more model chunks per rank")
                split_layers(layers, pp, virtual, split.first, split.last)


def unheld_interleaving(layers: int | None, pipeline: Iterable[int], schedules: Iterable[str],
                        split: PipelineSplitChoice, chunks_asked: bool = False) -> list[str]:
    """A note naming the pipeline degrees whose stages the interleaved schedules cannot split
    into the chunks a rank asked for (``--vpp``, ``chunks_asked``) or into the default count
    beside an uneven split (``--first-stage-layers``, ``--last-stage-layers``): the search ranks
    the one-chunk schedules there, and says so rather than drop interleaving unseen. The default
    count at an even split says nothing: a stage count it cannot split is the search's to skip."""
    schedules = list(schedules)
    uneven = split.first is not None or split.last is not None
    if layers is None or not (uneven or chunks_asked) or not any(SCHEDULES[s].multi_chunk for s in schedules):
        return []
    unheld = [pp for pp in pipeline if pp > 1 and not any(split.holds(layers, pp, v) for v in split.virtual)]
    if not unheld:
        return []
    chunks = " or ".join(map(str, split.virtual))
    ends = ", ".join(f"{n} stage {v}" for n, v in (("first", split.first), ("last", split.last)) if v is not None)
    with_ends = f" with {ends}" if ends else ""
    return [f"interleaved schedules left out at pipeline degree {listed(unheld)}: {chunks} chunks a rank cannot "
            f"split {layers} layers{with_ends} (every chunk between the end stages alike); ranked: the one-chunk "
            "schedules there (--pp with --schedule interleaved-1f1b names the splits and chunk counts that hold)"]


#: Why a model gets no tensor or pipeline layouts (``axes_note``, and ``--tp`` refused for it).
NO_PLANS = ("tensor and pipeline parallelism need nnperf's per-family plans (which Linear layers split by "
            "column or by row, and how blocks split into stages), declared by the built-in models' classes "
            "(tensor_parallel_plan, pipeline_split in nnperf/zoo/): the gpt2 and llama families and bert "
            "(pipelines: gpt2 and llama), and {name} is not one")


def axes_note(request: ModelRequest, gpus: int, asked: tuple[Any, Any], tensor: list[int],
              pipeline: list[int], model_info: tuple[Any, dict[str, Any], int | None] | None) -> list[str]:
    """A plan whose search left tensor and pipeline parallelism out although the user left them
    to ``auto`` says so in its text, and why (an ``hf:`` model has no per-family plan)."""
    if gpus == 1 or asked != (None, None) or tensor != [1] or pipeline != [1]:
        return []
    name = request_name(request)
    if model_info is None:
        why = NO_PLANS.format(name=name)
    else:
        why = (f"for {name} nnperf has no per-family plan (its model declares no tensor_parallel_plan or "
               "pipeline_split), or "
               "no degree above 1 divides its heads, FFN and sequence within a node and no stage count its "
               "layers")
    return [f"tensor and pipeline parallelism were not searched: {why}; the layouts ranked are data "
            "parallelism (DDP, ZeRO-1, FSDP2, HSDP) with checkpointing and gradient accumulation"]


def chunked_loss_axes(options: TraceOptions, tensor: Iterable[int] | None,
                      pipeline: Iterable[int] | None) -> tuple[Iterable[int] | None, Iterable[int] | None]:
    """A chunked loss (``trace.loss.ChunkedLoss``) runs the output projection in the loss, on a
    pipeline's last stage as torchtitan's ChunkedLossWrapper does; with tensor parallelism it
    runs split over the vocabulary with its inner cross entropy eager (``--loss chunked``), so
    ``chunked-compiled`` keeps the search to one tensor-parallel degree (``None``: auto) and
    refuses a degree the user asked for."""
    if options.loss != "chunked-compiled":
        return tensor, pipeline
    asked = [f"--tp {d}" for d in tensor or () if d > 1]
    if asked:
        raise UsageError(f"--loss chunked-compiled with {', '.join(asked)} is not modelled (the inner loss "
                         "compiled over a split vocabulary); give --tp 1, or --loss chunked for tensor "
                         "parallelism")
    return [1], pipeline


def listed(degrees: Iterable[int]) -> str:
    return ",".join(map(str, degrees))


def gpus_take_tensor(gpus: int, nodes_of: int, tp: int) -> bool:
    """Whether ``gpus`` GPUs in nodes of ``nodes_of`` can be cut into tensor-parallel groups of
    ``tp``: it divides them and fills nodes evenly (``check_degrees``)."""
    return tp >= 1 and gpus % tp == 0 and fills_nodes(tp, nodes_of)


def check_degrees(gpus: int, nodes_of: int, tensor: Iterable[int] | None, pipeline: Iterable[int] | None,
                  context: Iterable[int], layers: int | None = None) -> None:
    """A degree the user asked for that no layout of ``gpus`` GPUs can have is one line with the
    valid ones (it used to leave nothing to search, or only the other axes' layouts): a tensor
    degree divides the GPU count and fills nodes evenly (a divisor of the GPUs per node, or whole
    nodes: the SC21 paper's 16- and 32-way tensor parallelism over 8-GPU nodes, whose
    collectives then cross the network, as the plan times them; the search's own degrees stay
    inside a node); a pipeline degree divides what one asked tensor degree leaves of the GPUs
    (and holds at most ``layers`` stages), a context degree what one asked tensor and pipeline
    degree leave: the valid ones named are those the other asked degrees allow."""
    def divisors(n: int) -> list[int]:
        return [d for d in range(1, n + 1) if n % d == 0]

    def listing(degrees: Iterable[int]) -> str:
        return ", ".join(map(str, degrees))

    for tp in tensor or ():
        if not gpus_take_tensor(gpus, nodes_of, tp):
            valid = [d for d in divisors(gpus) if fills_nodes(d, nodes_of)]
            raise UsageError(f"--tp {tp}: a tensor-parallel group fills nodes evenly, so its degree divides the "
                             f"{nodes_of} GPUs per node or is whole nodes of them, and divides the {gpus} GPUs; "
                             f"valid: {listing(valid)}")
    tensor, pipeline = list(tensor or ()), list(pipeline or ())
    tp = tensor[0] if len(tensor) == 1 else 1  # the tensor degree divides the GPUs (above)
    for pp in pipeline:
        if pp < 1 or gpus % (tp * pp):
            valid = [d for d in divisors(gpus // tp) if layers is None or d <= layers]
            if tp == 1:
                raise UsageError(f"--pp {pp} does not divide the {gpus} GPUs; valid: {listing(valid)}")
            raise UsageError(f"--tp {tp} x --pp {pp} = {tp * pp} does not divide the {gpus} GPUs; pipeline "
                             f"degrees with --tp {tp}: {listing(valid)}")
    model_parallel = tp * (pipeline[0] if len(pipeline) == 1 else 1)
    for cp in context:
        if cp < 1 or gpus % (model_parallel * cp):
            valid = listing(divisors(gpus // model_parallel))
            if model_parallel == 1:
                raise UsageError(f"--cp {cp} does not divide the {gpus} GPUs; valid: {valid}")
            raise UsageError(f"--cp {cp}: tensor x pipeline ({model_parallel}) x context does not divide the {gpus} "
                             f"GPUs; valid: {valid}")


def expert_degrees(request: ModelRequest, gpus: int, nodes_of: int, expert: Iterable[int] | None,
                   model_info: tuple[Any, dict[str, Any], int | None] | None) -> list[int]:
    """The expert-parallel degrees to try: what the user gave (checked against the model's
    expert count), else for a mixture-of-experts model every power of two that divides its
    experts and stays inside a node (torchtitan keeps the expert all-to-all on NVLink).
    ``model_info``: ``model_info(request, layers)``."""
    from nnperf.trace.parallel.expert import has_experts

    experts = has_experts(model_info[0]) if model_info is not None else 0
    if expert is not None:
        expert = list(expert)
        if any(ep > 1 for ep in expert):
            if model_info is None:
                raise UsageError("expert parallelism (--ep) needs a built-in mixture-of-experts model "
                                 "(mixtral-8x7b, or llama-7b -O n_experts=N)")
            if not experts:
                raise UsageError(f"--ep: {request_name(request)} has no experts; expert parallelism needs a "
                                 "mixture-of-experts model (mixtral-8x7b, or llama-7b -O n_experts=N)")
            both = math.gcd(experts, gpus)  # a degree divides the experts and the GPUs
            valid = ", ".join(str(d) for d in range(1, both + 1) if both % d == 0)
            for ep in expert:
                if ep < 1 or gpus % ep:
                    raise UsageError(f"--ep {ep} does not divide the {gpus} GPUs; valid (dividing the GPUs and "
                                     f"the model's {experts} experts): {valid}")
                if experts % ep:
                    raise UsageError(f"--ep {ep} does not divide the model's {experts} experts; valid (dividing "
                                     f"them and the {gpus} GPUs): {valid}")
        return expert
    if not experts:
        return [1]
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if experts % d == 0 and d <= min(gpus, nodes_of)]


def _pipelines(model: Any) -> bool:
    from nnperf.trace.parallel.pipeline import split_of

    try:
        split_of(model)
    except UsageError:
        return False
    return True


def default_batch(request: ModelRequest) -> int:
    """Samples per GPU when neither --batch nor --global-batch is given: a built-in model's
    default batch (``nnperf models``), else one."""
    from nnperf.zoo import find_model

    spec = find_model(request.target) if isinstance(request.target, str) else None
    return spec.default_batch if spec else 1


def model_info(request: ModelRequest, layers: int | None) -> tuple[Any, dict[str, Any], int | None] | None:
    """A built-in model's module (one block, on the meta device), config and sequence length
    (``layers``: ``layers_of(request)``)."""
    if not isinstance(request.target, str) or ":" in request.target:
        return None
    import torch

    from nnperf.zoo import get_model

    spec = get_model(request.target)
    overrides = {**request.overrides, "n_layer": 1} if "n_layer" in spec.options else dict(request.overrides)
    with torch.device("meta"):
        workload = spec.build(1, request.seq_len, **overrides)
    config = workload.info.get("config", {})
    dense = leading_dense_blocks(config)
    if dense > SCALE_POINTS[0] and (layers or 0) > SCALE_POINTS[-1]:
        # both shallow traces must hold every dense block, the deeper one an expert block more
        raise UsageError(f"n_dense_layers={dense}: a deep stack is planned from traces of {SCALE_POINTS[0]} "
                         f"and {SCALE_POINTS[-1]} blocks per stage, which needs at most {SCALE_POINTS[0]} "
                         f"leading dense blocks; use n_dense_layers <= {SCALE_POINTS[0]}, or n_layer <= "
                         f"{SCALE_POINTS[-1]}")
    if dense and (layers or 0) > dense:
        # DeepSeek's first blocks are dense: the block that stands for the model is an expert block
        with torch.device("meta"):
            workload = spec.build(1, request.seq_len, **{**overrides, "n_dense_layers": 0})
    return workload.model, workload.info.get("config", {}), workload.info.get("seq_len")
