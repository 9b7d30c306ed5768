"""A planned layout as today's torchtitan takes it: a Python function returning a
``Trainer.Config``.

torchtitan stopped reading TOML job configs at commit 9810191 (2026-02-23): a run is now a
config function, chosen with ``--module`` and ``--config`` (torchtitan/config/README.md), and a
custom run derives from a shipped one by setting fields (torchtitan_recipes/tests/h100.py does
exactly that). The field names here were read at torchtitan commit b5bcd76 (2026-08-21):
``TrainingConfig`` (``num_tokens_per_microbatch_per_dp_rank``, ``num_tokens_per_train_step``,
``max_context_length``, ``mixed_precision_param``), ``ParallelismConfig`` and ``CompileConfig``
(``enable_async_tensor_parallel``; torchtitan/config/configs.py), the checkpointing policies
``SelectiveAC``/``FullAC`` or ``None`` (torchtitan/distributed/activation_checkpoint.py),
``ChunkedLossWrapper`` and ``CrossEntropyLoss`` (torchtitan/components/loss.py). The model, its
optimizer and data stay the base function's: the plan does not choose them. Tensor and expert parallelism are set to
run on DTensors (``spmd_backend = "partial_dtensor"``), the engine nnperf traces and whose host
cost per op it charges; torchtitan's default there is its own ``spmd_types`` path.
"""

from __future__ import annotations

from typing import Any

from nnperf.report.engine_configs import (
    SCHEDULE_NAMES,
    NotExpressible,
    compile_components,
    torchtitan_clipping,
    torchtitan_launch,
    torchtitan_param_dtype,
    torchtitan_pipeline_split,
    torchtitan_refusals,
)
from nnperf.trace.loss import DEFAULT_CHUNKS
from nnperf.trace.options import CHUNKED_LOSSES

#: The torchtitan this config is for.
TORCHTITAN_PYTHON_ERA = ("torchtitan's Python config functions (torchtitan/config/README.md; fields read at "
                         "commit b5bcd76 of 2026-08-21)")

#: The shipped config function each built-in family derives from (its model and optimizer):
#: torchtitan/models/<family>/config_registry.py.
BASES = {"llama": ("torchtitan.models.llama3.config_registry", "llama3_8b"),
         "deepseek": ("torchtitan.models.deepseek_v3.config_registry", "deepseek_v3_16b")}

#: The module and function names the torchrun command runs.
MODULE, FUNCTION = "nnperf_plan", "nnperf_plan"


def torchtitan_python(execution: Any, model: str, seq_len: int | None, amp: str | None = None,
                      dtype: str | None = None, sdpa: str = "fused", loss: str = "eager",
                      attention: str = "sdpa", doc_len: int = 0, clip: float | None = None,
                      layers: int | None = None, fp8: bool = False, pointwise: str = "eager") -> str:
    """The config function (a file ``nnperf_plan.py``) that sets every field the plan depends
    on over the shipped config of the model's family, torchtitan's defaults included. FP8 is a
    comment: where a model converter goes has moved between torchtitan's versions."""
    e = execution
    torchtitan_refusals(e, amp, dtype, sdpa)
    if not seq_len:
        raise NotExpressible("torchtitan counts its batch in tokens: the plan needs a sequence length (--seq)")
    family = "deepseek" if model.startswith("deepseek") else "llama"
    module, base = BASES[family]
    shard = 1 if e.replicates_parameters else e.shard
    replicate = e.replicate if e.data != "fsdp" else 1
    checkpoint = {None: "None", "full": "FullAC.Config()", "selective-op": "SelectiveAC.Config()"}[e.checkpoint]
    lines = [
        f"# {MODULE}.py: {TORCHTITAN_PYTHON_ERA}.",
        f"# The model, optimizer and data are {base}'s: put your model's config function there.",
        "from torchtitan.components.loss import ChunkedLossWrapper",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "from torchtitan.trainer import Trainer",
        f"from {module} import {base}",
        "",
        "",
        f"def {FUNCTION}() -> Trainer.Config:",
        f"    config = {base}()",
        # tokens of one forward per data-parallel rank (a pipeline's micro-batch), and of the step
        f"    config.training.num_tokens_per_microbatch_per_dp_rank = {e.micro_batch * seq_len}"
        f"  # micro-batch {e.micro_batch} x {seq_len}",
        f"    config.training.num_tokens_per_train_step = {e.global_batch * seq_len}"
        f"  # global batch {e.global_batch} x {seq_len}",
        f"    config.training.max_context_length = {seq_len}",
        f'    config.training.mixed_precision_param = "{torchtitan_param_dtype(amp)}"',
        "    " + torchtitan_clipping(clip, "config.training.max_norm = {}"),
        f"    config.parallelism.data_parallel_replicate_degree = {replicate}",
        f"    config.parallelism.data_parallel_shard_degree = {shard}",
        f'    config.parallelism.fsdp_reshard_after_forward = "{"always" if e.reshard_after_forward else "never"}"',
        f"    config.parallelism.tensor_parallel_degree = {e.tensor}",
        f"    config.parallelism.enable_sequence_parallel = {e.tensor == 1 or e.sequence_parallel}",
        f"    config.parallelism.pipeline_parallel_degree = {e.pipeline}",
    ]
    if e.tensor > 1 or e.expert > 1:  # the DTensor path nnperf traced (its host cost per op), not torchtitan's default
        lines.append('    config.parallelism.spmd_backend = "partial_dtensor"')
    if e.pipeline > 1:
        lines += [f'    config.parallelism.pipeline_parallel_schedule = "{SCHEDULE_NAMES[e.pipeline_schedule]}"',
                  f"    config.parallelism.num_pp_microbatches = {e.grad_accum}"]
        lines += [f"    config.parallelism.{name} = {value}" for name, value in torchtitan_pipeline_split(e, layers)]
    lines += [f"    config.parallelism.context_parallel_degree = {e.context}",
              f"    config.parallelism.expert_parallel_degree = {e.expert}",
              f"    config.activation_checkpoint = {checkpoint}"]
    if loss in CHUNKED_LOSSES:
        lines += ["    if not isinstance(config.loss, ChunkedLossWrapper.Config):",
                  f"        config.loss = ChunkedLossWrapper.Config(loss_fn=config.loss, num_chunks={DEFAULT_CHUNKS})"]
    else:  # the shipped configs chunk their loss; the plan's is one cross entropy
        lines += ["    if isinstance(config.loss, ChunkedLossWrapper.Config):",
                  "        config.loss = config.loss.loss_fn"]
    components = compile_components(loss, pointwise)
    if e.async_tp and "model" not in components:  # CompileConfig.__post_init__ refuses it
        raise NotExpressible("torchtitan runs async tensor parallelism with its compiled model only (\"Async TP "
                             "requires 'model' in --compile.components\"): plan with --pointwise fused")
    if components:
        lines += ["    config.compile.enable = True", f"    config.compile.components = {components!r}"]
        if e.async_tp:
            lines.append("    config.compile.enable_async_tensor_parallel = True")
    else:
        lines.append("    config.compile.enable = False")
    if attention == "flex":
        mask = "block_causal" if doc_len else "causal"
        lines.append(f"    # attention: FlexAttention with a {mask} mask, in the model spec of {base}")
    if fp8:
        lines.append("    # FP8: Float8LinearConverter.Config(filter_fqns=[\"output\", \"router.gate\"]) "
                     "(tensorwise) among the model's converters")
    lines.append("    return config")
    return "\n".join(lines)


def torchrun_python_command(execution: Any) -> str:
    """The ``torchrun`` line that runs the config function above from the directory that holds
    ``nnperf_plan.py`` (torchtitan's run_train.sh runs the same module)."""
    return f"{torchtitan_launch(execution)} --module {MODULE} --config {FUNCTION}"
