"""``nnperf plan MODEL --gpu h100 --gpus N``: layouts on N GPUs, ranked."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import click

from nnperf import progress
from nnperf.cli.app import cli
from nnperf.cli.gpu_options import gpu_options
from nnperf.cli.paths import check_output, write_output
from nnperf.cli.workload_options import pop_workload, workload_options
from nnperf.errors import ResourceError, UsageError
from nnperf.hardware import GPU
from nnperf.trace.options import TraceOptions


def _integers(text: str | None, what: str) -> list[int] | None:
    """``auto`` (None: every value the model and nodes allow) or comma-separated integers."""
    if text is None or text.lower() == "auto":
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"invalid {what} {text!r}: expected auto or integers like 1,2,4") from None
    if not values or any(v < 1 or v > 65536 for v in values):
        raise UsageError(f"invalid {what} {text!r}: every value must be 1 to 65536")
    _once(values, what, text)
    return values


def _once(values: list[Any], what: str, text: str) -> None:
    """A list option names each value once: ``--tp 1,1,1,1`` is a typo, not four searches."""
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise UsageError(f"invalid {what} {text!r}: {twice} is named {values.count(twice)} times; give each once")


def _levels(names: list[str] | None) -> list[str | None] | None:
    """The checkpointing levels named (None: auto, the search's default levels)."""
    from nnperf.layout import CHECKPOINT_NAMES

    return None if names is None else [CHECKPOINT_NAMES[n] for n in names]


def _names(text: str, what: str, valid: tuple[str, ...], auto: bool = True) -> list[str] | None:
    """``auto`` (None: all of ``valid``; where ``auto`` is allowed) or comma-separated names
    from ``valid``."""
    if auto and text.lower() == "auto":
        return None
    names = [n.strip().lower() for n in text.split(",")]
    if any(n not in valid for n in names):
        expected = f"{'auto or ' if auto else ''}a list of {', '.join(valid)}"
        raise UsageError(f"invalid {what} {text!r}: expected {expected}")
    _once(names, what, text)
    return names


@cli.command()
@workload_options
@gpu_options(profile=False)
@click.option("--gpus", "n_gpus", type=click.IntRange(1, 65536), required=True, help="GPUs to lay the step out on.")
@click.option("--nodes-of", type=click.IntRange(1, 1024), default=None,
              help="GPUs per node (default: the cluster's).")
@click.option("--global-batch", type=click.IntRange(1, 1 << 24), default=None,
              help="Samples per optimizer step over all GPUs (default: --batch, or a built-in model's "
                   "default batch, per GPU); the search splits it into micro-batches.")
@click.option("--tokens-per-step", type=click.IntRange(1, 1 << 44), default=None,
              help="Tokens per optimizer step over all GPUs, instead of --global-batch: the global batch is "
                   "this over the sequence length (--seq, or a built-in model's).")
@click.option("--tp", "tp_text", default="auto", show_default=True,
              help="Tensor-parallel degrees to try: auto (every degree the model's heads and FFN and the "
                   "node allow) or a list, e.g. 1,8.")
@click.option("--pp", "pp_text", default="auto", show_default=True,
              help="Pipeline-parallel degrees to try: auto (gpt2/llama built-ins) or a list, e.g. 1,4.")
@click.option("--cp", "cp_text", default="1", show_default=True,
              help="Context-parallel degrees to try (ring attention over the sequence, modelled in closed "
                   "form on a traced rank), e.g. 1,2,4.")
@click.option("--ep", "ep_text", default="auto", show_default=True,
              help="Expert-parallel degrees to try for a mixture-of-experts model (experts split over "
                   "FSDP's shard group or DDP's and ZeRO-1's replicas, tokens sent by all-to-all or DeepEP "
                   "(--dispatcher); beside --tp "
                   "with ddp or zero1 as Megatron-Core runs it: each expert split over the tensor-parallel "
                   "ranks, or whole with the expert group folded over them where the data-parallel ranks "
                   "alone cannot hold it): auto (powers of two dividing the experts, inside a node) or a "
                   "list, e.g. 1,8.")
@click.option("--etp", "etp_text", default="auto", show_default=True,
              help="Expert tensor parallelism beside --tp and --ep (Megatron-LM's --expert-tensor-parallel-size): "
                   "auto (Megatron-Core's default: each expert split over the tensor-parallel ranks, whole with "
                   "the expert group folded over them where the data-parallel ranks alone cannot hold it) or 1 "
                   "(each expert whole on a rank, the expert group always folded over the tensor-parallel ranks, "
                   "as DeepSeek-V3's and Qwen3's recipes run); the --tp degree itself is auto's split.")
@click.option("--dispatcher", "token_dispatcher", type=click.Choice(["alltoall", "deepep"]), default="alltoall",
              show_default=True,
              help="How expert-parallel layouts send tokens to their experts: alltoall (NCCL's all-to-all, a copy "
                   "per expert: Megatron-LM's alltoall dispatcher, torchtitan's) or deepep (DeepEP's kernels, a "
                   "copy per node, forwarded over NVLink: Megatron-LM's flex dispatcher, beside ddp or zero1).")
@click.option("--ep-overlap", "expert_overlap", is_flag=True,
              help="Expert-parallel layouts overlap the experts' all-to-alls across micro-batches, each "
                   "backward beside the next forward layer by layer (Megatron-LM's "
                   "--overlap-moe-expert-parallel-comm: beside ddp or zero1, without a pipeline or with an "
                   "interleaved one, without full recomputation).")
@click.option("--optimizer-states", "optimizer_states", type=click.Choice(["fp32", "bf16-moments", "bf16"]),
              default="fp32", show_default=True,
              help="What the zero1 layouts' distributed optimizer keeps per parameter: fp32 (an fp32 main copy "
                   "and fp32 Adam moments, Megatron-LM's default), bf16-moments (the moments in bf16: "
                   "Megatron-LM's --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16) "
                   "or bf16 (bf16 moments and no main copy beside a --dtype bf16 model: Apex's "
                   "DistributedFusedAdam in bf16, NeMo's optim.dtype bf16). Other engines keep their own.")
@click.option("--grad-reduce-in-fp32", "grad_reduce_in_fp32", is_flag=True,
              help="The zero1 layouts of a --dtype bf16 or fp16 model keep fp32 main gradients and "
                   "reduce-scatter them in fp32 (twice the bytes): Megatron-LM's default for --bf16 "
                   "(--accumulate-allreduce-grads-in-fp32 unless --grad-reduce-in-bf16), NeMo's and "
                   "Megatron-Bridge's bf16 mixed precision (grad_reduce_in_fp32). Without it they are reduced "
                   "in the model's dtype.")
@click.option("--data", "data_text", default="auto", show_default=True,
              help="Data-parallel engines to try: auto (ddp, zero1, fsdp, hsdp) or a list, e.g. fsdp,hsdp. "
                   "zero1: DDP with the optimizer state sharded (Megatron-LM's distributed optimizer).")
@click.option("--framework", type=click.Choice(["auto", "megatron", "torch"]), default="auto", show_default=True,
              help="The framework the layouts are planned as: auto (Megatron-LM's where only it runs a layout: "
                   "ZeRO-1, DDP beside tensor, pipeline or context parallelism, or one of its own settings; "
                   "torch's elsewhere, layouts without data parallelism included), megatron (Megatron-LM's "
                   "tensor parallelism, loss and pipeline schedules everywhere; ddp and zero1) or torch "
                   "(DTensor and torch.distributed.pipelining, as torchtitan composes them; ddp alone, fsdp, "
                   "hsdp). Both run tensor and pipeline parallelism without data parallelism, and hold and "
                   "time it differently.")
@click.option("--checkpoint", "checkpoint_text", default="auto", show_default=True,
              help="Activation checkpointing the search may use: auto (none, selective, full) or a list, "
                   "e.g. none or none,full; tried from none to full while a layout does not fit. selective: "
                   "each layout's engine's own policy, torchtitan's per-op one (selective-op) where torchtitan "
                   "runs the layout, Megatron-LM's core attention (selective-attention, --recompute-activations) "
                   "where only Megatron-LM does (ZeRO-1; DDP beside tensor, pipeline or context parallelism).")
@click.option("--reshard", "reshard_text", default="always", show_default=True,
              help="FSDP2's reshard after forward without pipelines: always (torchtitan's default), never "
                   "(the gathered parameters kept until backward: no backward all-gather, more memory), "
                   "or always,never to rank both. Pipelines never reshard, as torchtitan's.")
@click.option("--schedule", "schedules", multiple=True,
              type=click.Choice(["1f1b", "interleaved-1f1b", "gpipe", "zero-bubble"]),
              help="Pipeline schedules to try (repeatable; default: 1f1b and interleaved-1f1b).")
@click.option("--vpp", "vpp_text", default="2", show_default=True,
              help="Model chunks per rank of the interleaved schedules (Megatron-LM's virtual pipeline stages), "
                   "e.g. 2 or 2,4: each must divide the layers of a pipeline stage.")
@click.option("--first-stage-layers", type=click.IntRange(0, 1 << 20), default=None,
              help="Blocks of the pipeline's first stage, shorter than the others as it also holds the "
                   "embedding (Megatron-LM's --decoder-first-pipeline-num-layers); the stages between split "
                   "the rest evenly. With interleaving, over the stage's chunks: evenly where they divide, "
                   "else its first chunk is the shorter, down to the embedding alone (Llama 3 405B: 126 "
                   "layers, --pp 16 --vpp 8 --first-stage-layers 7 --last-stage-layers 7).")
@click.option("--last-stage-layers", type=click.IntRange(0, 1 << 20), default=None,
              help="Blocks of the pipeline's last stage, which also holds the head and the loss "
                   "(--decoder-last-pipeline-num-layers). With interleaving, over the stage's chunks: evenly "
                   "where they divide, else its last chunk is the shorter, down to the head and loss alone.")
@click.option("--tp-comm-overlap", is_flag=True,
              help="Megatron-LM's --tp-comm-overlap on its layouts (ddp or zero1 with tensor parallelism): "
                   "Transformer Engine's userbuffers run each block's sequence-parallel all-gather and "
                   "reduce-scatter in chunks beside the GEMM it feeds or follows.")
@click.option("--async-tp", "async_tp", is_flag=True,
              help="torch's async tensor parallelism on the layouts torch runs (tensor parallelism beside fsdp, "
                   "hsdp or no data parallelism; torchtitan's enable_async_tensor_parallel, which needs the "
                   "compiled blocks: --pointwise fused): Inductor pipelines each block's sequence-parallel "
                   "all-gather and reduce-scatter with the matmuls it feeds or follows.")
@click.option("--cross-entropy-loss-fusion", "loss_fusion", is_flag=True,
              help="Megatron-LM's --cross-entropy-loss-fusion on its layouts (ddp or zero1): Megatron-Core's "
                   "fused cross entropy, its pieces compiled one by one, instead of its unfused passes.")
@click.option("--sequence-parallel/--no-sequence-parallel", "sequence_parallel", default=None,
              help="Tensor-parallel layouts with sequence parallelism only, or without it only (Megatron-LM "
                   "before 2022, --sequence-parallel off); default: both, ranked.")
@click.option("--micro-batch", "micro_text", default="auto", show_default=True,
              help="Micro-batch sizes the search may use (Megatron-LM's --micro-batch-size): auto (every size "
                   "a layout's schedule can run: 1F1B at least one micro-batch a stage, or fewer beside ddp or "
                   "zero1 where a rank's samples make no more, as Megatron-LM runs them; interleaved a multiple "
                   "of the stages) or a list, e.g. 2 or 1,2; of several, the largest that fits is kept (a "
                   "pipeline's smaller ones while faster).")
@click.option("--cluster", "cluster_name", default=None,
              help="Built-in cluster (dgx-a100, dgx-b200, dgx-h100, dgx-h200) or a cluster TOML file.")
@click.option("--host", "host_name", metavar="CPU", default=None,
              help="The nodes' host CPU eager PyTorch dispatches from, e.g. cloud-vm or xeon-8480c "
                   "(hardware/hosts.toml): host costs scale with its single-core clock. Default: the "
                   "cluster's (a DGX's own CPU; cloud-vm, the virtual machine a rented GPU comes with, "
                   "for a cluster file that names none).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document.")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the JSON document to this file (atomically: an interrupted run leaves the old file), "
                   "for 'nnperf measure --layout FILE'.")
def plan(gpu: GPU, n_gpus: int, nodes_of: int | None, global_batch: int | None, tokens_per_step: int | None,
         tp_text: str, pp_text: str,
         cp_text: str, ep_text: str, etp_text: str, token_dispatcher: str, expert_overlap: bool, optimizer_states: str,
         grad_reduce_in_fp32: bool, data_text: str, framework: str,
         checkpoint_text: str, reshard_text: str,
         schedules: tuple[str, ...], vpp_text: str, first_stage_layers: int | None, last_stage_layers: int | None,
         tp_comm_overlap: bool, async_tp: bool, loss_fusion: bool, sequence_parallel: bool | None, micro_text: str,
         cluster_name: str | None, host_name: str | None, as_json: bool, output: str | None,
         **kwargs: Any) -> None:
    """Rank the layouts of MODEL on --gpus GPUs (data parallelism: DDP, ZeRO-1, FSDP2, HSDP; tensor
    parallelism with sequence parallelism; pipeline schedules; activation checkpointing and
    gradient accumulation; expert parallelism for mixture-of-experts models): step time, throughput, MFU, per-GPU memory, exposed communication,
    pipeline bubble; and the winner as a torchtitan config with its torchrun command, Megatron-LM
    arguments and a DeepSpeed config where those engines have the layout."""
    from nnperf.hardware.cluster import cluster_for_gpu, load_cluster
    from nnperf.hardware.host import load_host
    from nnperf.layout import DATA_ENGINES, INTERLEAVE
    from nnperf.search.plan import CHECKPOINT_NAMES, DATA_KINDS, DEFAULT_SCHEDULES, smallest_memory
    from nnperf.search.plan import plan as run_plan
    from nnperf.search.plan.layouts import PipelineSplitChoice

    if output is not None:
        check_output(output, "--output")  # before minutes of tracing
    cluster = load_cluster(cluster_name) if cluster_name else cluster_for_gpu(gpu.id)
    if cluster is None:
        from nnperf.hardware.cluster import list_clusters

        raise UsageError(f"no built-in cluster of {gpu.name}; give --cluster with a built-in one whose links "
                         f"its nodes share ({', '.join(list_clusters())}: its links with this GPU), or "
                         "a cluster FILE (a copy of hardware/clusters/dgx-h100.toml)")
    if host_name is not None:
        cluster = replace(cluster, host=load_host(host_name).id)
    nodes = nodes_of or cluster.gpus_per_node
    if n_gpus > nodes and n_gpus % nodes:
        low, high = n_gpus // nodes * nodes, (n_gpus // nodes + 1) * nodes
        raise UsageError(f"--gpus {n_gpus} is not a whole number of {nodes}-GPU nodes; nearest: {low} or {high}")
    request, options = pop_workload(kwargs)
    if tokens_per_step is not None:
        global_batch = _global_batch_of(tokens_per_step, global_batch, request)
    if global_batch is not None and request.batch is not None:
        raise UsageError(f"--batch {request.batch} with --global-batch {global_batch}: the plan searches the "
                         "micro-batch itself; give --global-batch alone, or --batch alone for a global batch "
                         f"of --batch x --gpus ({request.batch * n_gpus} here)")
    if not options.train:
        raise UsageError("nnperf plan lays out training steps (data, tensor, pipeline and context parallelism "
                         "of forward, backward and optimizer); for one GPU's inference use 'nnperf predict "
                         "--inference'")
    _once(list(schedules), "--schedule", " ".join(schedules))
    _check_vpp_has_a_schedule(vpp_text, schedules)
    data_kinds = _names(data_text, "--data", DATA_KINDS)
    if loss_fusion and options.loss != "eager":
        raise UsageError(f"--cross-entropy-loss-fusion is Megatron-Core's fused cross entropy and --loss "
                         f"{options.loss} another loss: give one of them")
    if loss_fusion and data_kinds is not None and not any(DATA_ENGINES[k].replicates_parameters
                                                           for k in data_kinds):
        raise UsageError(f"--cross-entropy-loss-fusion is Megatron-LM's, which runs ddp or zero1: --data "
                         f"{data_text} has neither")
    axes = {"tensor": _integers(tp_text, "--tp"), "pipeline": _integers(pp_text, "--pp"),
            "schedules": schedules or DEFAULT_SCHEDULES, "context": _integers(cp_text, "--cp") or [1],
            "expert": _integers(ep_text, "--ep"), "data": data_kinds,
            "checkpoints": _levels(_names(checkpoint_text, "--checkpoint", tuple(CHECKPOINT_NAMES))),
            "reshard": [n == "always" for n in _names(reshard_text, "--reshard", ("always", "never"),
                                                      auto=False) or ()],
            "split": PipelineSplitChoice(tuple(_integers(vpp_text, "--vpp") or (INTERLEAVE,)),
                                         first_stage_layers, last_stage_layers, _given("vpp_text")),
            "micro_batch": _integers(micro_text, "--micro-batch")}
    with progress.shown(f"plan {n_gpus} GPUs: layout groups searched", enabled=not as_json):
        result = run_plan(request, options, gpu, n_gpus, cluster, nodes, global_batch, **axes,
                          tp_comm_overlap=tp_comm_overlap, loss_fusion=loss_fusion,
                          sequence_parallel=sequence_parallel, expert_tensor=_expert_tensor(etp_text),
                          token_dispatcher=token_dispatcher, optimizer_states=optimizer_states,
                          grad_reduce_in_fp32=grad_reduce_in_fp32, expert_overlap=expert_overlap,
                          framework=None if framework == "auto" else framework, async_tp=async_tp)
    if result.cluster.gpu and result.cluster.gpu != gpu.id:
        result.notes.append(f"{result.cluster.name} is built of {result.cluster.gpu}, planned here with {gpu.id}: "
                            "its links, NICs and host CPU are taken as they are")
    configs = engine_configs(result, options, request.overrides)
    document = json.dumps({**result.to_json(), **configs}, indent=2)
    if output is not None:
        write_output(output, "--output", lambda tmp: tmp.write_text(document + "\n", encoding="utf-8"))
    if as_json:
        click.echo(document)
    else:
        _print(result, configs)
    if not result.ranked:
        raise ResourceError(smallest_memory(result))


def _given(parameter: str) -> bool:
    """Whether the user gave ``parameter`` on the command line (not its default)."""
    return click.get_current_context().get_parameter_source(parameter) == click.core.ParameterSource.COMMANDLINE


def _check_vpp_has_a_schedule(vpp_text: str, schedules: tuple[str, ...]) -> None:
    """An asked --vpp splits the stages of the interleaved schedules: one line where every asked
    --schedule runs one chunk a rank (the plan would run them and leave --vpp unused)."""
    from nnperf.layout import MULTI

    if _given("vpp_text") and schedules and not MULTI & set(schedules):
        raise UsageError(f"--vpp {vpp_text} splits each rank's stages into chunks, which --schedule "
                         f"{' '.join(schedules)} does not run (one chunk a rank): add --schedule "
                         f"{' or '.join(sorted(MULTI))}, or drop --vpp")


def _expert_tensor(text: str) -> int | None:
    """``--etp``: auto (None: Megatron-Core's default), 1, or a degree the search checks (the
    ``--tp`` degree is the default split)."""
    if text.strip().lower() == "auto":
        return None
    if text.strip().isdigit() and int(text) >= 1:
        return int(text)
    raise UsageError(f"invalid --etp {text!r}: expected auto (each expert split over the tensor-parallel ranks, as "
                     "Megatron-Core's default), 1 (each expert whole on a rank) or the --tp degree")


def _global_batch_of(tokens: int, global_batch: int | None, request: Any) -> int:
    """The global batch that holds ``tokens`` per step: whole sequences of the run's length."""
    if global_batch is not None:
        raise UsageError(f"--tokens-per-step {tokens} with --global-batch {global_batch}: give one of them")
    from nnperf.zoo import find_model

    spec = find_model(request.target) if isinstance(request.target, str) else None
    seq = request.seq_len or (spec.default_seq if spec else None)
    if not seq:
        raise UsageError(f"--tokens-per-step {tokens}: give the sequence length (--seq) to divide it by")
    if tokens % seq:
        from nnperf.search.accumulation import nearest_multiples

        raise UsageError(f"--tokens-per-step {tokens} is not a whole number of {seq}-token sequences; "
                         f"nearest: {nearest_multiples(tokens, seq)} (or --global-batch in sequences)")
    return tokens // seq


def engine_configs(result: Any, options: TraceOptions, model_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """For each engine, the fastest ranked layout it can run: its config text, and where that is
    not the winner, which layout it is (``{engine}_layout``) and why the engine cannot run the
    winner (``{engine}_not_expressible``; with no text, why it can run none of them). A DeepSpeed
    config for a tensor- or pipeline-parallel layout is Megatron-DeepSpeed's, whose own arguments
    set the rest (``deepspeed_launch``)."""
    from nnperf.report.engine_configs import (
        NotExpressible,
        check_torchtitan_model,
        deepspeed_json,
        megatron_args,
        megatron_deepspeed_args,
        torchrun_command,
        torchtitan_toml,
    )
    from nnperf.report.torchtitan_python import torchrun_python_command, torchtitan_python

    if not result.ranked:
        return {}
    out: dict[str, Any] = {}
    amp, dtype, sdpa, clip = options.amp, options.dtype, options.sdpa, options.clip_grad_norm
    model_options = model_options or {}
    attention, doc_len = str(model_options.get("attention", "sdpa")), str(model_options.get("doc_len", 0))
    documents = int(doc_len) if doc_len.isdigit() else 0  # a built-in decoder's, checked when it was built
    seq = result.seq_len

    def torchtitan(execution: Any) -> str:
        check_torchtitan_model(result.model)
        return torchtitan_toml(execution, amp, dtype, sdpa, options.loss, attention, documents, seq, clip,
                               result.layers, fp8=options.fp8, pointwise=options.pointwise)

    def torchtitan_function(execution: Any) -> str:
        check_torchtitan_model(result.model)
        return torchtitan_python(execution, result.model, seq, amp, dtype, sdpa, options.loss, attention, documents,
                                 clip, result.layers, fp8=options.fp8, pointwise=options.pointwise)

    writers = {"torchtitan": torchtitan, "torchtitan_python": torchtitan_function,
               "megatron": lambda e: megatron_args(e, result.layers, amp, dtype, sdpa, attention, seq, clip,
                                                   fp8=options.fp8, pointwise=options.pointwise),
               "deepspeed": lambda e: deepspeed_json(e, amp, dtype, clip, fp8=options.fp8)}
    best = result.ranked[0]
    chosen: dict[str, Any] = {}
    for name, write in writers.items():
        out[name] = None
        for rank, planned in enumerate(result.ranked, 1):
            try:
                out[name] = write(planned.execution)
            except NotExpressible as why:
                out.setdefault(f"{name}_not_expressible", str(why))  # the winner's reason
                continue
            chosen[name] = planned.execution
            if rank > 1:
                out[f"{name}_layout"] = {"rank": rank, "layout": planned.execution.describe(),
                                         "slower_by": planned.step_s / best.step_s - 1}
            break
    deepspeed = chosen.get("deepspeed")
    out["deepspeed_launch"] = (megatron_deepspeed_args(deepspeed, amp, dtype, seq)
                               if deepspeed is not None and deepspeed.tensor * deepspeed.pipeline > 1 else None)
    # the command runs torchtitan with the TOML above: without one there is nothing to run
    out["torchrun"] = torchrun_command(chosen["torchtitan"]) if out["torchtitan"] else None
    out["torchrun_python"] = torchrun_python_command(chosen["torchtitan_python"]) if out["torchtitan_python"] else None
    return out


def _slowed(split: Any) -> str:
    """The parts of the compute time that activation checkpointing's recomputation and
    collectives running beside kernels added (``split``: a ``TimeSplit``)."""
    parts = []
    if split.recomputation_s > 0:
        parts.append(f"{split.recomputation_s * 1e3:.2f} ms of it recomputation")
    if split.overlap_slowdown_s > 0:
        parts.append(f"{split.overlap_slowdown_s * 1e3:.2f} ms slowed by overlapping collectives")
    return f" ({'; '.join(parts)})" if parts else ""


def _host(planned: Any) -> str:
    """The host's time to issue the step, as a share of the step (``planned``: a ``Planned``):
    it runs beside the device, so it is no part of the sum before it; near the whole step, the
    step waits on the host (the host-bound case), well below it the device's work hides it."""
    host, step = planned.split.host_s, planned.step_s
    share = f", {host / step:.0%} of the step" if step else ""
    return f"host {host * 1e3:.2f} ms to issue it (beside the device{share})"


def _print(result: Any, configs: dict[str, Any]) -> None:
    from nnperf.request import model_label
    from nnperf.units import rate

    click.echo(f"{model_label(result.model, result.model_options)} on {result.gpus} x {result.gpu.label} "
               f"({result.cluster.name}, host {result.cluster.host}), "
               f"global batch {result.global_batch} ({result.options.describe()}); "
               f"{result.traces} rank role{'' if result.traces == 1 else 's'} traced")
    for i, p in enumerate(result.ranked, 1):
        exposed = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in p.split.exposed_communication_s.items()) or "none"
        bubble = p.split.pipeline_bubble_s
        extra = f", bubble {bubble * 1e3:.2f} ms" if bubble is not None else ""
        # two lines a layout, so a list of them scans: what it is and what it gives, then where
        # its step goes and why it ranks there
        click.echo(f"{i}. {p.execution.describe()}: step {p.step_s * 1e3:.2f} ms, "
                   f"{rate(p.throughput, p.throughput_unit)}, MFU {p.mfu:.1%}, "
                   f"{p.memory_bytes / 2**30:.2f} GiB/GPU")
        click.echo(f"   compute {p.split.compute_s * 1e3:.2f} ms{_slowed(p.split)}, "
                   f"exposed communication: {exposed}{extra}; {_host(p)} — {p.reason}")
    for p in result.rejected:
        click.echo(f"rejected: {p.execution.describe()}: {p.reason}")
    for note in result.notes:
        click.echo(f"note: {note}")
    if not configs:
        return
    if configs.get("torchtitan"):
        click.echo("\ntorchtitan config (plan.toml)" + _which_layout(configs, "torchtitan") + ":\n"
                   + configs["torchtitan"])
        click.echo("\n" + configs["torchrun"])
    if configs.get("torchtitan_python"):
        click.echo("\ntorchtitan config function (nnperf_plan.py, torchtitan after 2026-02-23)"
                   + _which_layout(configs, "torchtitan_python") + ":\n" + configs["torchtitan_python"])
        click.echo("\n" + configs["torchrun_python"])
    for name, title in (("megatron", "Megatron-LM arguments (the layout's; the model's own, --num-layers, "
                                     "--hidden-size and the rest, --num-experts and --moe-router-topk for experts, "
                                     "are the run's)"),
                        ("deepspeed", "DeepSpeed config (ds_config.json)")):
        if configs.get(name):
            click.echo(f"\n{title}{_which_layout(configs, name)}:\n{configs[name]}")
            if name == "deepspeed" and configs.get("deepspeed_launch"):
                click.echo("\nMegatron-DeepSpeed arguments (the model parallelism ds_config.json cannot hold):\n"
                           + configs["deepspeed_launch"])
        else:
            click.echo(f"\n{title}: none — {configs[f'{name}_not_expressible']}")
    if not configs.get("torchtitan"):
        click.echo(f"\ntorchtitan: none — {configs['torchtitan_not_expressible']}")


def _which_layout(configs: dict[str, Any], engine: str) -> str:
    """Where an engine's config is not the winner's: which ranked layout it runs, and why; the
    winner's said too where another engine's config is another layout's."""
    layout = configs.get(f"{engine}_layout")
    if not layout:
        others = any(value for key, value in configs.items() if key.endswith("_layout") and key != f"{engine}_layout")
        return " for #1, the fastest" if others else ""
    return (f" for #{layout['rank']}, {layout['layout']} ({layout['slower_by']:.1%} slower), the fastest it "
            f"runs; the winner it cannot: {configs[f'{engine}_not_expressible']}")
