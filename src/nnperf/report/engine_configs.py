"""A planned layout written for the training engines users run: torchtitan's TOML and its
``torchrun`` command, Megatron-LM's command-line arguments, DeepSpeed's JSON config.

Each writer returns the text, or raises ``NotExpressible`` naming what the engine lacks, so a
plan never prints a config that would run something else than what was planned. Sources for
the names: torchtitan ``torchtitan/config/job_config.py`` (``[parallelism]`` with
``expert_parallel_degree``,
``[activation_checkpoint]``, ``[training]``); Megatron-LM ``megatron/training/arguments.py``
(``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--num-layers-per-virtual-pipeline-stage``, ``--sequence-parallel``, ``--use-torch-fsdp2``,
``--torch-fsdp2-no-reshard-after-forward``, ``--recompute-*``) and its FSDP2 guide
(``--no-gradient-accumulation-fusion --ckpt-format torch_dist``); DeepSpeed's config
documentation (``zero_optimization.stage``, MiCS ``mics_shard_size`` for sharding inside a
group and replicating across, ``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``, ``bf16``/``fp16``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from nnperf.errors import UsageError
from nnperf.layout import OPTIMIZER_STATES, SCHEDULES
from nnperf.trace.loss import DEFAULT_CHUNKS
from nnperf.trace.options import CHUNKED_LOSSES

SCHEDULE_NAMES = {name: schedule.torchtitan for name, schedule in SCHEDULES.items()}


class NotExpressible(Exception):
    """The engine has no equivalent of (part of) the layout."""


#: The torchtitan the TOML is for: its job config read TOML files (``--job.config_file``) until
#: the Python config registry replaced them (torchtitan commit 9810191, 2026-02-23).
TORCHTITAN_TOML_ERA = "torchtitan's TOML job config (torchtitan/config/job_config.py, before commit 9810191 of 2026-02-23)"

#: torchtitan's mixed_precision_param: Literal["bfloat16", "float32"] (no float16).
_TORCHTITAN_PARAM_DTYPE = {"bf16": "bfloat16", None: "float32"}


def check_torchtitan_model(model: str) -> None:
    """torchtitan trains decoder language models (its Llama 3/4, DeepSeek-V3, Qwen3): a layout
    of an image model or an encoder has no torchtitan run to configure."""
    if model.split(":")[0] in ("timm", "tv", "torchvision"):
        raise NotExpressible(f"torchtitan trains decoder language models; {model} is an image model")
    from nnperf.zoo import find_model

    spec = find_model(model)  # not a built-in (an hf: model, a file): the user knows what it is
    if spec is not None and spec.family != "decoder":
        raise NotExpressible(f"torchtitan trains decoder language models; {model} is a {spec.family} model")


def torchtitan_toml(execution: Any, amp: str | None = None, dtype: str | None = None,
                    sdpa: str = "fused", loss: str = "eager", attention: str = "sdpa", doc_len: int = 0,
                    seq_len: int | None = None, clip: float | None = None, layers: int | None = None,
                    fp8: bool = False, pointwise: str = "eager") -> str:
    """The [training], [parallelism] and [activation_checkpoint] tables torchtitan reads, [float8]
    for FP8 linears (its converter, named in the run's own [model] table), and
    [compile] for a compiled loss (``--loss compiled``) or model (``--pointwise fused``: each
    block compiled; torchtitan compiles the components named, ``compile_components``);
    a chunked loss, and FlexAttention (a built-in decoder's ``-O attention=flex``), are comments
    naming the Python settings torchtitan has for them. Every setting the plan depends on is
    written, torchtitan's defaults included (its mixed_precision_param defaults to bfloat16, its
    seq_len to 2048, its selective checkpointing to every second block in full). torchtitan
    clips the gradients every step (``max_norm``, default 1.0): a plan without clipping says so
    (``torchtitan_clipping``)."""
    e = execution
    torchtitan_refusals(e, amp, dtype, sdpa)
    shard = 1 if e.replicates_parameters else e.shard
    replicate = e.replicate if e.data != "fsdp" else 1
    # torchtitan's local_batch_size is what one rank's step feeds forward: a pipeline splits it
    # into micro-batches of pipeline_parallel_microbatch_size; otherwise it is the micro-batch,
    # and global_batch_size // (local_batch_size x data-parallel ranks) steps accumulate
    # (torchtitan train.py: gradient_accumulation_steps).
    local = e.micro_batch * e.grad_accum if e.pipeline > 1 else e.micro_batch
    lines = [
        f"# {TORCHTITAN_TOML_ERA}; [job], [model] (name, flavor) and [optimizer] are the run's own",
        "[training]",
        f"local_batch_size = {local}",
        f"global_batch_size = {e.global_batch}",
    ]
    if seq_len:
        lines.append(f"seq_len = {seq_len}")
    lines.append(f'mixed_precision_param = "{_TORCHTITAN_PARAM_DTYPE[amp]}"')
    lines.append(torchtitan_clipping(clip, "max_norm = {}"))
    lines += [
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{"always" if e.reshard_after_forward else "never"}"',
        f"tensor_parallel_degree = {e.tensor}",
        f"disable_loss_parallel = {'false' if e.loss_parallel else 'true'}",
        f"pipeline_parallel_degree = {e.pipeline}",
    ]
    if e.pipeline > 1:
        lines += [f'pipeline_parallel_schedule = "{SCHEDULE_NAMES[e.pipeline_schedule]}"',
                  f"pipeline_parallel_microbatch_size = {e.micro_batch}"]
        lines += [f"{name} = {value}" for name, value in torchtitan_pipeline_split(e, layers)]
    if e.replicates_parameters and e.data_parallel > 1 and e.pipeline == 1 and e.grad_accum > 1:
        lines.append(f"# the plan reduces DDP's gradients once per step (no_sync before the last of the {e.grad_accum} "
                     f"micro-batches, as Megatron-LM); reduced every micro-batch, {e.grad_accum - 1} reductions more")
    if e.async_tp:
        if pointwise != "fused":
            raise NotExpressible("torchtitan runs async tensor parallelism with its compiled model only (\"Async TP "
                                 "requires torch.compile\"): plan with --pointwise fused")
        lines.append("enable_async_tensor_parallel = true")
    lines.append(f"context_parallel_degree = {e.context}")
    if e.expert > 1:
        lines.append(f"expert_parallel_degree = {e.expert}")
    lines += ["", "[activation_checkpoint]",
              f'mode = "{"selective" if e.checkpoint == "selective-op" else e.checkpoint or "none"}"']
    if e.checkpoint == "selective-op":
        lines.append('selective_ac_option = "op"')
    if e.tensor > 1 and not e.sequence_parallel:
        raise NotExpressible("torchtitan always uses sequence parallelism with tensor parallelism")
    if loss in CHUNKED_LOSSES:  # no TOML key: torchtitan's trainers set it in their Python config
        lines += ["", "# loss: torchtitan's ChunkedLossWrapper, set in the trainer's Python config:",
                  f"# loss = ChunkedLossWrapper.Config(num_chunks={DEFAULT_CHUNKS})"]
    components = compile_components(loss, pointwise)
    if components:
        lines += ["", "[compile]", "enable = true", f"components = {json.dumps(components)}"]
    if fp8:  # torchao's float8 linears, tensorwise dynamic scaling (the era's default recipe); the
        # output head and a mixture of experts' router left out, as planned (trace.blocks.is_router)
        # and as torchtitan's MoE configurations set it (a dense model has no router.gate)
        lines += ["", '# FP8: add converters = ["float8"] to the run\'s [model] table', "[float8]",
                  'filter_fqns = ["output", "router.gate"]']
    if attention == "flex":  # torchtitan's ModelArgs of the flavor (2025: use_flex_attn, attn_mask_type)
        mask = "block_causal" if doc_len else "causal"
        lines += ["", "# attention: FlexAttention, set in the model flavor's args:",
                  f'# use_flex_attn = True, attn_mask_type = "{mask}"'
                  + (f" (documents of {doc_len} tokens assumed)" if doc_len else "")]
    return "\n".join(lines)


def torchtitan_pipeline_split(execution: Any, layers: int | None) -> list[tuple[str, int]]:
    """torchtitan's settings for the layout's split of the blocks over the pipeline's chunks.
    Its default shortens the first and the last chunk by one block each (the embedding and the
    head counted as a block: ``pipeline_parallel_first_stage_less_layers = 1``, ``..._last_...``,
    ``generate_llm_fqn_per_model_part``), so an even split says 0 and 0; an uneven one the
    blocks of the chunks between (``pipeline_parallel_layers_per_stage``, which also sets the
    chunks per rank) and how many fewer the first and last hold."""
    e = execution
    if layers is None:
        if e.uneven or e.chunks_per_rank not in (1, 2):
            raise NotExpressible("the layout's pipeline split needs the model's block count")
        return [("pipeline_parallel_first_stage_less_layers", 0), ("pipeline_parallel_last_stage_less_layers", 0)]
    try:
        depths = e.chunk_layers(layers)
    except UsageError as why:
        raise NotExpressible(str(why)) from None
    middle = max(depths) if len(depths) == 2 else depths[1]
    fewer_first, fewer_last = middle - depths[0], middle - depths[-1]
    if fewer_first < 0 or fewer_last < 0:
        raise NotExpressible("torchtitan shortens the first and last pipeline stages; it does not lengthen them")
    if any(d != middle for d in depths[1:-1]):
        raise NotExpressible("torchtitan's first/last_stage_less_layers shorten the model's first and last chunk "
                             "only; this split shortens other chunks of the end stages (name each chunk's modules "
                             "in module_fqns_per_model_part)")
    return [("pipeline_parallel_layers_per_stage", middle),
            ("pipeline_parallel_first_stage_less_layers", fewer_first),
            ("pipeline_parallel_last_stage_less_layers", fewer_last)]


def compile_components(loss: str, pointwise: str) -> list[str]:
    """What torchtitan's [compile] names: "model" (each transformer block compiled: the plan's
    fused pointwise ops, ``passes.fusion``) and "loss" (a compiled cross entropy)."""
    return ([*(["model"] if pointwise == "fused" else []),
             *(["loss"] if loss in ("compiled", "chunked-compiled") else [])])


def torchtitan_refusals(e: Any, amp: str | None, dtype: str | None, sdpa: str) -> None:
    """What no torchtitan, TOML or Python config, can set: raised as one ``NotExpressible``."""
    missing = []
    if e.framework == "megatron":
        missing.append("the layout is planned as Megatron-LM runs it (--framework megatron): plan with "
                       "--framework torch for torchtitan's")
    if e.data == "zero1":
        missing.append("torchtitan has no ZeRO-1 (the optimizer state sharded over DDP's ranks): its data "
                       "parallelism replicates (DDP) or shards parameters too (FSDP2, HSDP)")
    if e.expert > 1 and e.replicates_parameters:
        missing.append("torchtitan carves its expert group out of the FSDP shard group (dp_shard x cp x tp), "
                       "not out of DDP's replicas")
    if dtype not in (None, "fp32"):
        missing.append(f"torchtitan keeps fp32 parameters and computes in {dtype} through "
                       f"mixed_precision_param (plan with --amp); a model cast to {dtype} is not "
                       "one of its settings")
    if amp not in _TORCHTITAN_PARAM_DTYPE:
        missing.append(f"torchtitan's mixed_precision_param is bfloat16 or float32, not {amp} (plan with --amp bf16)")
    if e.checkpoint == "selective":
        missing.append("nnperf's selective checkpointing (every weight matmul and the fused attention saved) is "
                       "not one of torchtitan's policies: its per-op policy (selective-op) recomputes every "
                       "second matmul")
    if e.checkpoint == "selective-attention":
        missing.append("torchtitan has no attention-only recomputation (Megatron-LM's --recompute-activations)")
    if e.tp_comm_overlap:
        missing.append("Transformer Engine's userbuffers overlap (Megatron-LM's --tp-comm-overlap) is not "
                       "torchtitan's: its own is async tensor parallelism (plan with --async-tp and --pointwise "
                       "fused)")
    if e.expert_overlap:
        missing.append("torchtitan runs no micro-batch's expert all-to-alls beside another's compute "
                       "(Megatron-LM's --overlap-moe-expert-parallel-comm)")
    if e.loss_fusion:
        missing.append("Megatron-Core's fused cross entropy (--cross-entropy-loss-fusion) is not torchtitan's; "
                       "its compiled loss is (plan with --loss compiled)")
    if e.checkpoint == "selective-op-recompute-a2a":
        missing.append("today's torchtitan saves the expert all-to-alls under selective op checkpointing; "
                       "its earlier list that recomputed them is not a setting")
    if e.pipeline > 1 and e.pipeline_schedule == "1f1b" and e.grad_accum < e.pipeline:
        missing.append(f"torch's Schedule1F1B, torchtitan's, needs at least as many micro-batches as stages "
                       f"({e.grad_accum} < {e.pipeline}); Megatron-LM's 1F1B runs fewer")
    if sdpa == "unfused":
        missing.append("torchtitan's attention is SDPA's fused kernels; unfused attention is not "
                       "one of its settings")
    if sdpa == "cudnn":
        missing.append("torchtitan sets SDPA's backend order itself (cuDNN first only on compute capability "
                       "10.x, flash first before it); cuDNN attention first is not one of its settings")
    if missing:
        raise NotExpressible("; ".join(missing))


def torchtitan_clipping(clip: float | None, setting: str) -> str:
    """torchtitan's gradient clipping line (``setting`` formatted with the norm): it clips every
    step (``training.max_norm``, default 1.0; its trainer calls ``clip_grad_norm_`` whatever the
    value), so a plan that did not count clipping says what the run adds."""
    if clip is not None:
        return setting.format(repr(float(clip)))
    return ("# max_norm: torchtitan clips the gradients every step (default 1.0), which this plan "
            "did not count: plan with --clip-grad-norm 1.0 to include it")


def torchtitan_param_dtype(amp: str | None) -> str:
    """torchtitan's mixed_precision_param for ``--amp`` (checked by ``torchtitan_refusals``)."""
    return _TORCHTITAN_PARAM_DTYPE[amp]


def torchtitan_launch(execution: Any) -> str:
    """``torchrun`` of torchtitan's trainer over the layout's nodes, without its config."""
    per_node = min(execution.world, execution.gpus_per_node)
    nodes = max(1, execution.world // per_node)
    return (f"torchrun --nnodes={nodes} --nproc_per_node={per_node} --rdzv_backend=c10d "
            "--rdzv_endpoint=$HEAD_NODE:29500 -m torchtitan.train")


def torchrun_command(execution: Any) -> str:
    return f"{torchtitan_launch(execution)} --job.config_file plan.toml"


def megatron_layout(depths: tuple[int, ...]) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` of the chunks' block counts, in model
    order: ``E`` the embedding, ``t`` a transformer block, ``L`` the loss, ``|`` between chunks,
    ``(x|)*n`` a repeated chunk (megatron/core/transformer/pipeline_parallel_layer_layout.py,
    ``parse_str_to_list``): the one way its arguments split an end stage's blocks unevenly over
    its virtual chunks (its --decoder-first/last-pipeline-num-layers need them divisible), and
    the one way to an end chunk of the embedding or the loss alone (``E|``, ``|L``: Llama 3
    405B's)."""
    chunks = [f"t*{d}" if d else "" for d in depths]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    runs = [(chunk, len(list(same))) for chunk, same in itertools.groupby(chunks)]
    return "".join(f"({chunk}|)*{n}," if n > 1 else f"{chunk}|" for chunk, n in runs).rstrip("|,")


def _batch_args(e: Any, seq_len: int | None) -> list[str]:
    """Megatron-LM's batch and sequence arguments, which Megatron-DeepSpeed keeps."""
    return [f"--micro-batch-size {e.micro_batch}", f"--global-batch-size {e.global_batch}"] + \
        ([f"--seq-length {seq_len}"] if seq_len else [])


def megatron_args(execution: Any, layers: int | None, amp: str | None = None,
                  dtype: str | None = None, sdpa: str = "fused", attention: str = "sdpa",
                  seq_len: int | None = None, clip: float | None = None, fp8: bool = False,
                  pointwise: str = "eager") -> str:
    """Megatron-LM's parallelism, batch, recomputation, precision and clipping arguments for the
    layout. Its ``--bf16``/``--fp16`` hold the model in half precision with fp32 master weights
    in the optimizer: the nearest to both ``--amp`` and ``--dtype`` (a ``--dtype bf16`` plan's
    gradients are reduced in bf16: ``--grad-reduce-in-bf16``, unless the plan keeps fp32 main
    gradients, ``Execution.grad_reduce_in_fp32``); ``--fp8`` adds Transformer
    Engine's FP8 with per-tensor current scaling (``--fp8-recipe tensorwise``, E4M3 forward and
    E5M2 gradients: ``--fp8-format hybrid``). Its ``--clip-grad``
    defaults to 1.0: a plan without clipping leaves it and says so in a comment line."""
    e = execution
    if attention == "flex":
        raise NotExpressible("FlexAttention is not one of Megatron-LM's attention backends (--attention-backend: "
                             "flash, fused, unfused, local, auto)")
    if e.framework == "torch":
        raise NotExpressible("the layout is planned as torch runs it (--framework torch): plan with --framework "
                             "megatron for Megatron-LM's")
    if e.async_tp:
        raise NotExpressible("async tensor parallelism (--async-tp) is torch's, not Megatron-LM's: its own is "
                             "--tp-comm-overlap (Transformer Engine's userbuffers)")
    if e.data == "hsdp":
        raise NotExpressible("Megatron-LM's torch FSDP2 path shards over the whole data-parallel group (no HSDP)")
    if e.expert > 1 and not e.replicates_parameters:
        raise NotExpressible("Megatron-LM's expert parallelism (--expert-model-parallel-size) runs with its own "
                             "data-parallel engine and distributed optimizer, not the torch FSDP2 sharding planned here")
    if e.pipeline > 1 and e.pipeline_schedule not in ("1f1b", "interleaved-1f1b"):
        raise NotExpressible(f"Megatron-LM runs 1F1B and interleaved 1F1B, not {e.pipeline_schedule}")
    if e.expert_overlap and not _half_precision(amp, dtype):
        raise NotExpressible("Megatron-Core runs --overlap-moe-expert-parallel-comm with a bf16 or fp16 model only "
                             "(TransformerConfig's check): plan with --amp bf16 or --dtype bf16")
    args = [f"--tensor-model-parallel-size {e.tensor}", f"--pipeline-model-parallel-size {e.pipeline}"]
    if e.context > 1:  # the scheme the plan times (search.plan.context): K and V all-gathered, not Megatron's p2p
        # ring; the string Transformer Engine's attn_forward_func_with_cp takes (its "all_gather" branch)
        args += [f"--context-parallel-size {e.context}", "--cp-comm-type all_gather"]
    if e.expert > 1:  # carved out of the data-parallel ranks, the experts' gradients reduced over the rest;
        # tokens sent to their experts as planned: by all-to-all (Megatron-LM's default is allgather) or
        # DeepEP (the flex dispatcher's backend, Megatron-Core 0.14 on)
        args.append(f"--expert-model-parallel-size {e.expert}")
        # each rank's experts as Transformer Engine's GroupedLinear, as timed
        # (kernels.grouped_gemm; without it Megatron-Core loops over them, SequentialMLP)
        args.append("--moe-grouped-gemm")
        args += (["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]
                 if e.token_dispatcher == "deepep" else ["--moe-token-dispatcher-type alltoall"])
        if e.tensor > 1:  # each expert split as the dense layers are (Megatron-Core's default, said),
            # or whole where the expert group folds over the tensor-parallel ranks
            args.append(f"--expert-tensor-parallel-size {1 if e.folds_experts else e.tensor}")
        if e.expert_overlap:  # its launch setting: a comment below the arguments
            args.append("--overlap-moe-expert-parallel-comm")
    if e.pipeline > 1 and (e.virtual_stages > 1 or e.uneven):
        if not layers:
            raise NotExpressible("the pipeline's split needs the layer count")
        depths = e.chunk_layers(layers)
        v = e.chunks_per_rank
        first, last = sum(depths[::e.pipeline]), sum(depths[e.pipeline - 1::e.pipeline])
        # the end stages' chunks differ, or one holds the embedding (the loss) alone: a layout string
        if e.uneven and (first % v or last % v or not first or not last):
            args.append(f'--pipeline-model-parallel-layout "{megatron_layout(depths)}"')
        elif e.uneven:
            args += [f"--decoder-first-pipeline-num-layers {first}", f"--decoder-last-pipeline-num-layers {last}"]
            if v > 1:
                args.append(f"--num-virtual-stages-per-pipeline-rank {v}")
        else:
            args.append(f"--num-layers-per-virtual-pipeline-stage {depths[0]}")
    if e.sequence_parallel:
        args.append("--sequence-parallel")
    if e.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if e.loss_fusion:
        args.append("--cross-entropy-loss-fusion")
    args += _batch_args(e, seq_len)
    if e.replicates_parameters and e.data_parallel > 1:
        # Megatron-LM's DDP as planned: buckets reduced as backward fills them; ZeRO-1 its
        # distributed optimizer, the parameters gathered as the next forward starts; buckets of
        # the plan's size in its gradients' elements: fp32 main gradients (what --bf16 makes of
        # them, and --amp plans), or a --dtype plan's 16 bits (fp16's default; bf16 with
        # --grad-reduce-in-bf16)
        args.append("--overlap-grad-reduce")
        if e.data == "zero1":
            args += ["--use-distributed-optimizer", "--overlap-param-gather"]
            states = OPTIMIZER_STATES[e.optimizer_states]
            if states.megatron_args is None:
                raise NotExpressible(f"Megatron-LM's distributed optimizer keeps a main copy of the parameters; "
                                     f"optimizer states {states.name} are {states.source}")
            if states.megatron_args:
                args.append(states.megatron_args)
        if dtype == "bf16" and not e.grad_reduce_in_fp32:  # the weights' dtype, autocast or not
            args.append("--grad-reduce-in-bf16")
        elif dtype == "fp16" and e.grad_reduce_in_fp32:  # fp32 main gradients: --bf16's default, not --fp16's
            args.append("--accumulate-allreduce-grads-in-fp32")
        args.append(f"--ddp-bucket-size {e.bucket_bytes // (2 if dtype in ('bf16', 'fp16') else 4)}")
    if e.data == "fsdp" and e.data_parallel > 1:
        args += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format torch_dist"]
        if not e.reshard_after_forward:
            args.append("--torch-fsdp2-no-reshard-after-forward")
    if e.checkpoint in ("selective-op", "selective-op-recompute-a2a"):
        raise NotExpressible("Megatron-LM has no per-op recomputation policy (torchtitan's selective op)")
    if e.checkpoint == "selective":
        raise NotExpressible("nnperf's selective checkpointing (every weight matmul and the fused attention "
                             "saved) is not Megatron-LM's: its --recompute-activations recomputes the core "
                             "attention only (selective-attention)")
    if e.checkpoint == "selective-attention":
        args.append("--recompute-activations")
    elif e.checkpoint == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    half = _half_precision(amp, dtype)
    if half:
        args.append(f"--{half}")
    if fp8:
        args += ["--fp8-format hybrid", "--fp8-recipe tensorwise"]
    if sdpa == "fused":  # PyTorch's flash kernel as planned: Megatron-Core's auto would pick cuDNN's on Hopper
        args.append("--attention-backend flash")
    elif sdpa == "unfused":
        args.append("--attention-backend unfused")
    elif sdpa == "cudnn":  # Transformer Engine's fused attention: cuDNN's kernel
        args.append("--attention-backend fused")
    if clip is not None:
        args.append(f"--clip-grad {float(clip)!r}")
    text = " \\\n  ".join(args)
    if clip is None:  # a plan never switches a user's clipping off
        text += ("\n# --clip-grad: Megatron-LM clips the gradients to 1.0 by default, which this plan did not "
                 "count: plan with --clip-grad-norm 1.0 to include it")
    if e.expert_overlap:
        text += ("\n# --overlap-moe-expert-parallel-comm: launch with CUDA_DEVICE_MAX_CONNECTIONS=32 (the Megatron MoE "
                 "Model Zoo's launch script; 1, which tensor parallelism wants, keeps the streams in one queue)")
    if pointwise == "eager":  # its defaults: --bias-dropout-fusion, --bias-swiglu-fusion, --rope-fusion...
        text += ("\n# fusions: Megatron-LM fuses bias-dropout-add, SwiGLU/GeLU, RoPE and the masked softmax by "
                 "default (Transformer Engine's layers the norms too), which this plan timed as separate "
                 "kernels: plan with --pointwise fused to count them")
    return text


def _half_precision(amp: str | None, dtype: str | None) -> str | None:
    """The 16-bit format an engine's ``bf16``/``fp16`` switch names for ``--amp`` or a 16-bit
    ``--dtype`` (both engines hold a half-precision model with fp32 master weights)."""
    return amp or (dtype if dtype in ("bf16", "fp16") else None)


def deepspeed_json(execution: Any, amp: str | None = None, dtype: str | None = None,
                   clip: float | None = None, fp8: bool = False) -> str:
    """DeepSpeed's config: ZeRO stage 0 (DDP), 1 (ZeRO-1: the optimizer state sharded), 3 (FSDP
    full shard) or 3 with MiCS (HSDP);
    ``bf16``/``fp16`` (a half-precision model, fp32 master weights) for ``--amp`` or
    ``--dtype``, a ``--dtype bf16`` model's gradients accumulated in bf16 as planned
    (``data_types.grad_accum_dtype``); ``gradient_clipping`` (default 0: off) for
    ``--clip-grad-norm``. Attention is the model code's, not the JSON's. A layout with tensor or
    pipeline parallelism is Megatron-DeepSpeed's: the JSON holds its batch, ZeRO stage,
    precision and clipping, its own arguments the rest (``megatron_deepspeed_args``)."""
    e = execution
    if fp8:
        raise NotExpressible("DeepSpeed's JSON has no FP8 training: its FP8 runs Transformer Engine's layers, "
                             "put in the model code")
    if e.expert > 1:
        raise NotExpressible("DeepSpeed's expert parallelism is set in the model code "
                             "(deepspeed.moe.layer.MoE(ep_size=...)), not its JSON")
    if e.context > 1:
        raise NotExpressible("context parallelism (ring attention over sequence shards) is not DeepSpeed's: its "
                             "sequence parallelism is Ulysses' all-to-all (DistributedAttention, in the model code)")
    if e.tensor > 1 or e.pipeline > 1:
        _check_megatron_deepspeed(e)
    elif e.checkpoint:
        raise NotExpressible("DeepSpeed checkpoints activations through deepspeed.checkpointing in the "
                             "model code, not its JSON")
    if e.optimizer_states != "fp32":
        raise NotExpressible(f"DeepSpeed's ZeRO keeps fp32 master weights and moments; optimizer states "
                             f"{e.optimizer_states} are {OPTIMIZER_STATES[e.optimizer_states].source}")
    if not e.replicates_parameters and not e.reshard_after_forward:
        raise NotExpressible("DeepSpeed's ZeRO-3 frees gathered parameters after each module's forward; keeping "
                             "them until backward is not one of its settings (ZeRO-2 keeps every parameter whole)")
    zero: dict[str, Any] = {"stage": _zero_stage(e)}
    if e.data == "hsdp":
        zero.update(mics_shard_size=e.shard, mics_hierarchical_params_gather=False)
    if e.data not in (None, "ddp"):
        zero["reduce_scatter"] = True
    config: dict[str, Any] = {
        "train_batch_size": e.global_batch,
        "train_micro_batch_size_per_gpu": e.micro_batch,
        "gradient_accumulation_steps": e.grad_accum,
        "zero_optimization": zero,
    }
    if clip is not None:
        config["gradient_clipping"] = clip
    half = _half_precision(amp, dtype)
    if half:
        config[half] = {"enabled": True}
    if e.grad_reduce_in_fp32:
        raise NotExpressible("DeepSpeed keeps fp32 gradients of a bf16 model in its BF16_Optimizer, which "
                             "all-reduces them whole (twice the bytes of the planned reduce-scatter), and of an "
                             "fp16 model none (engine.py _do_optimizer_sanity_check)")
    if dtype == "bf16":
        if config["zero_optimization"]["stage"] == 0 and e.pipeline == 1:
            raise NotExpressible("DeepSpeed without ZeRO accumulates a bf16 model's gradients in fp32 (its "
                                 "BF16_Optimizer: bf16 accumulation needs ZeRO or a pipeline, engine.py "
                                 "_do_optimizer_sanity_check), not in bf16 as planned")
        # the plan's gradients are the bf16 model's own: DeepSpeed accumulates them in fp32 where no
        # ZeRO stage is on unless told (engine.py get_data_types: BF16_Optimizer's fp32 buffers)
        config["data_types"] = {"grad_accum_dtype": "bf16"}
    return json.dumps(config, indent=2)


def _zero_stage(e: Any) -> int:
    """DeepSpeed's ZeRO stage of the layout's data-parallel engine (none: 0)."""
    return {"ddp": 0, "zero1": 1, None: 0}.get(e.data, 3)


def _check_megatron_deepspeed(e: Any) -> None:
    """What Megatron-DeepSpeed (github.com/microsoft/Megatron-DeepSpeed, ``megatron/arguments.py``
    and DeepSpeed's ``runtime/pipe``) cannot run of a tensor- or pipeline-parallel layout."""
    if e.pipeline > 1 and e.pipeline_schedule != "1f1b":
        raise NotExpressible(f"DeepSpeed's pipeline engine runs 1F1B (its TrainSchedule), not {e.pipeline_schedule}")
    if e.pipeline > 1 and e.data not in (None, "ddp", "zero1"):
        raise NotExpressible("DeepSpeed's pipeline engine runs beside ZeRO stage 0 or 1 only, not the sharded "
                             f"parameters of {e.data}")
    if e.data == "hsdp":
        raise NotExpressible("DeepSpeed's MiCS (HSDP) is not one of Megatron-DeepSpeed's layouts beside tensor "
                             "parallelism")
    if e.uneven:
        raise NotExpressible("Megatron-DeepSpeed splits the blocks over its stages by its partition method in the "
                             "model code (BLOOM's 'type:transformer|embedding' counts each embedding as a block), "
                             "not shortened first and last stages")
    if e.tp_comm_overlap:
        raise NotExpressible("Transformer Engine's tensor-parallel overlap (userbuffers) is Megatron-Core's, "
                             "not Megatron-DeepSpeed's")
    if e.async_tp:
        raise NotExpressible("async tensor parallelism (--async-tp) is torch's compiled blocks', not "
                             "Megatron-DeepSpeed's")
    if e.loss_fusion:
        raise NotExpressible("the fused cross entropy (--cross-entropy-loss-fusion) is Megatron-Core's, not "
                             "Megatron-DeepSpeed's")
    if e.expert_overlap:
        raise NotExpressible("the expert all-to-alls' overlap across micro-batches "
                             "(--overlap-moe-expert-parallel-comm) is Megatron-Core's, not Megatron-DeepSpeed's")
    if e.checkpoint not in (None, "full", "selective-attention"):
        raise NotExpressible(f"Megatron-DeepSpeed recomputes whole blocks or the core attention, not nnperf's "
                             f"{e.checkpoint} policy")


def megatron_deepspeed_args(execution: Any, amp: str | None = None, dtype: str | None = None,
                            seq_len: int | None = None) -> str:
    """Megatron-DeepSpeed's arguments for a layout ``deepspeed_json`` writes with tensor or
    pipeline parallelism: the model parallelism, batch, recomputation and precision its JSON
    cannot hold (``megatron/arguments.py``: ``--tensor-model-parallel-size``,
    ``--pipeline-model-parallel-size``, ``--no-pipeline-parallel`` without DeepSpeed's pipeline
    engine, Megatron-LM's ``--sequence-parallel``, ``--checkpoint-activations``,
    ``--recompute-granularity selective``, ``--zero-stage``, and DeepSpeed's own
    ``--deepspeed --deepspeed_config``)."""
    e = execution
    _check_megatron_deepspeed(e)
    args = [f"--tensor-model-parallel-size {e.tensor}", f"--pipeline-model-parallel-size {e.pipeline}"]
    if e.pipeline == 1:
        args.append("--no-pipeline-parallel")
    if e.sequence_parallel:
        args.append("--sequence-parallel")
    args += _batch_args(e, seq_len)
    if e.checkpoint == "full":
        args.append("--checkpoint-activations")
    elif e.checkpoint == "selective-attention":
        args.append("--recompute-granularity selective")
    half = _half_precision(amp, dtype)
    if half:
        args.append(f"--{half}")
    args += [f"--zero-stage {_zero_stage(e)}", "--deepspeed", "--deepspeed_config ds_config.json"]
    return " \\\n  ".join(args)
