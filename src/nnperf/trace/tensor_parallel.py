"""Tensor (and sequence) parallel plans for the zoo's transformers, applied with PyTorch's own
``parallelize_module``.

Megatron-LM's split (Shoeybi et al. 2019, "Megatron-LM", section 3): inside a block the
first linear of attention (q, k, v) and of the MLP is split by output columns
(``ColwiseParallel``), the second by input rows (``RowwiseParallel``), so each block costs one
all-reduce in forward and one in backward per sub-layer. Sequence parallelism (Korthikanti et
al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.2.2)
splits the norms, dropouts and residuals along the sequence: the all-reduce becomes a
reduce-scatter after the row-parallel linear and an all-gather before the column-parallel one
(``SequenceParallel`` + ``PrepareModuleInput``). The plans are torchtitan's for Llama
(torchtitan/models/llama3/infra/parallelize.py, ``apply_tp``), written for the zoo's GPT-2
and BERT module names the same way; embeddings are split by vocabulary rows
(``RowwiseParallel`` on ``nn.Embedding``) and the output projection by vocabulary columns,
its logits gathered (``Replicate``) for the loss.

What differs from Megatron and is the engine's real behaviour here: GPT-2's packed ``c_attn``
is split in contiguous column blocks (Megatron interleaves q/k/v per head so a shard holds
whole heads; shapes and costs are the same); tied embedding/output weights stay one
``Shard(0)`` parameter (re-tied after splitting); GPT-2's learned positions are sliced to the
rank's sequence shard under sequence parallelism (no communication in forward, an
all-gather of their gradient in backward); BERT's pooler and pre-training heads gather the
sequence first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nnperf.errors import UsageError


@dataclass(frozen=True)
class Family:
    """A model family's tensor-parallel plan: ``plan(model, mesh, sp)`` applies it;
    ``divisible(config)``: the sizes TP must divide, by name."""

    name: str
    plan: Callable[[nn.Module, Any, bool, bool], None]
    divisible: Callable[[dict[str, Any]], dict[str, int]]
    loss_parallel: bool = True  # its output projection can stay split over the vocabulary


def _styles() -> Any:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    return (Replicate, Shard, ColwiseParallel, RowwiseParallel, SequenceParallel,
            PrepareModuleInput, PrepareModuleOutput)


def _gather_input(n_inputs: int = 1, local: bool = False) -> Any:
    """Sequence-sharded input -> replicated (the all-gather before a column-parallel linear)."""
    Replicate, Shard, *_, PrepareModuleInput, _ = _styles()
    rest = (None,) * (n_inputs - 1)
    return PrepareModuleInput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest),
                              use_local_output=local)


def _logits(loss_parallel: bool) -> dict[str, Any]:
    """The output projection's result: split over the vocabulary for a loss-parallel cross
    entropy (``loss_parallel()``, torchtitan's default), else gathered."""
    Replicate, Shard, *_ = _styles()
    if loss_parallel:
        return {"output_layouts": Shard(-1), "use_local_output": False}
    return {"output_layouts": Replicate()}


def _llama(model: nn.Module, mesh: Any, sp: bool, loss_parallel: bool) -> None:
    """torchtitan's ``apply_tp`` for Llama."""
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, Colwise, Rowwise, SequenceParallel, *_ = _styles()
    seq = Shard(1) if sp else Replicate()
    for layer in model.layers:
        plan: dict[str, Any] = {
            "attention.wq": Colwise(), "attention.wk": Colwise(), "attention.wv": Colwise(),
            "attention.wo": Rowwise(output_layouts=seq),
            "feed_forward.w1": Colwise(), "feed_forward.w3": Colwise(),
            "feed_forward.w2": Rowwise(output_layouts=seq),
        }
        if sp:
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                         "attention": _gather_input(), "feed_forward": _gather_input()})
        parallelize_module(layer, mesh, plan)
    top: dict[str, Any] = {
        "tok_embeddings": Rowwise(input_layouts=Replicate(), output_layouts=seq),
        "output": Colwise(input_layouts=seq, **_logits(loss_parallel)),
    }
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, mesh, top)


def _gpt2(model: nn.Module, mesh: Any, sp: bool, loss_parallel: bool) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, Colwise, Rowwise, SequenceParallel, _, PrepareModuleOutput = _styles()
    seq = Shard(1) if sp else Replicate()
    for block in model.h:
        plan: dict[str, Any] = {
            "attn.c_attn": Colwise(), "attn.c_proj": Rowwise(output_layouts=seq),
            "mlp.c_fc": Colwise(), "mlp.c_proj": Rowwise(output_layouts=seq),
        }
        if sp:
            plan.update({"ln_1": SequenceParallel(), "ln_2": SequenceParallel(),
                         "attn": _gather_input(), "mlp": _gather_input()})
        parallelize_module(block, mesh, plan)
    top: dict[str, Any] = {
        "wte": Rowwise(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": Colwise(input_layouts=seq, **_logits(loss_parallel)),
    }
    if sp:
        top["ln_f"] = SequenceParallel()
        top["wpe"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0),
                                         use_local_output=True)
    parallelize_module(model, mesh, top)
    model.lm_head.weight = model.wte.weight  # both Shard(0) over the vocabulary: still tied


def _bert(model: nn.Module, mesh: Any, sp: bool, loss_parallel: bool) -> None:
    """Logits gathered (the MLM head adds its own bias after the decoder; no loss parallelism)."""
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, Colwise, Rowwise, SequenceParallel, _, PrepareModuleOutput = _styles()
    seq = Shard(1) if sp else Replicate()
    for layer in model.bert.encoder.layer:
        plan: dict[str, Any] = {
            "attention.self.query": Colwise(), "attention.self.key": Colwise(),
            "attention.self.value": Colwise(), "attention.output.dense": Rowwise(output_layouts=seq),
            "intermediate.dense": Colwise(), "output.dense": Rowwise(output_layouts=seq),
        }
        if sp:  # post-norm: the norms' outputs are the residuals, kept as local shards
            plan.update({"attention.output.LayerNorm": SequenceParallel(use_local_output=True),
                         "output.LayerNorm": SequenceParallel(use_local_output=True),
                         "attention.self": _gather_input(), "intermediate": _gather_input()})
        parallelize_module(layer, mesh, plan)
    top: dict[str, Any] = {
        "bert.embeddings.word_embeddings": Rowwise(input_layouts=Replicate(), output_layouts=Replicate()),
        # a DTensor, so the head's own (replicated) bias adds to it
        "cls.predictions.decoder": Colwise(output_layouts=Replicate(), use_local_output=False),
    }
    if sp:
        top["bert.embeddings"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                                     use_local_output=True)
        top["bert.pooler"] = _gather_input(local=True)
        top["cls"] = _gather_input(2, local=True)
    parallelize_module(model, mesh, top)
    model.cls.predictions.decoder.weight = model.bert.embeddings.word_embeddings.weight


def _families() -> dict[type, Family]:
    from nnperf.zoo.bert import BertForPreTraining
    from nnperf.zoo.gpt2 import GPT2
    from nnperf.zoo.llama import Llama

    return {
        Llama: Family("llama", _llama, lambda c: {"n_heads": c["n_heads"], "n_kv_heads": c["n_kv_heads"],
                                                  "ffn_hidden": c["ffn_hidden"]}),
        GPT2: Family("gpt2", _gpt2, lambda c: {"n_head": c["n_head"], "4 x n_embd (MLP)": 4 * c["n_embd"]}),
        BertForPreTraining: Family("bert", _bert, lambda c: {"n_head": c["n_head"],
                                                              "intermediate": c["intermediate"]}, False),
    }


def family_of(model: nn.Module) -> Family:
    from nnperf.trace.expert_parallel import has_experts
    from nnperf.zoo.mla import MultiHeadLatentAttention

    if has_experts(model):
        raise UsageError("tensor parallelism of mixture-of-experts layers (torchtitan's expert tensor "
                         "parallelism) is not modelled; lay the experts out with expert parallelism (--ep) "
                         "and data parallelism")
    if any(isinstance(m, MultiHeadLatentAttention) for m in model.modules()):
        raise UsageError("tensor parallelism of multi-head latent attention (DeepSeek's) has no plan here; "
                         "use data, pipeline or expert parallelism")
    family = _families().get(type(model))
    if family is None:
        raise UsageError(f"tensor parallelism needs a plan for {type(model).__name__}; plans exist for "
                         "the built-in gpt2, llama and bert families")
    return family


def check_divisible(model: nn.Module, config: dict[str, Any], tensor: int, sequence_parallel: bool,
                    seq_len: int | None) -> None:
    """One line naming the first size ``tensor`` does not divide and the nearest TP degrees that
    divide them all."""
    sizes = dict(family_of(model).divisible(config))
    if sequence_parallel and seq_len:
        sizes["sequence length (sequence parallel)"] = seq_len
    bad = [(name, value) for name, value in sizes.items() if value % tensor]
    if not bad:
        return
    common = math.gcd(*sizes.values())
    valid = [d for d in range(1, common + 1) if common % d == 0]
    below = max((d for d in valid if d < tensor), default=None)
    above = min((d for d in valid if d > tensor), default=None)
    nearest = " or ".join(str(d) for d in (below, above) if d is not None)
    name, value = bad[0]
    raise UsageError(f"tensor parallel degree {tensor} does not divide {name} = {value} "
                     f"({', '.join(sizes)} must all be divisible); nearest valid degrees: {nearest}")


def valid_degrees(model: nn.Module, config: dict[str, Any], sequence_parallel: bool,
                  seq_len: int | None, limit: int) -> list[int]:
    """Tensor-parallel degrees up to ``limit`` that divide every size the plan splits."""
    sizes = dict(family_of(model).divisible(config))
    if sequence_parallel and seq_len:
        sizes["seq"] = seq_len
    common = math.gcd(*sizes.values())
    return [d for d in range(1, limit + 1) if common % d == 0]


def uses_loss_parallel(model: nn.Module, wanted: bool) -> bool:
    return wanted and family_of(model).loss_parallel


def apply_tensor_parallel(model: nn.Module, mesh: Any, sequence_parallel: bool, loss_parallel: bool = False) -> bool:
    """Split ``model`` over the 1-D tensor-parallel ``mesh`` with its family's plan, then
    replicate every parameter the plan left alone (``replicate_rest``). ``loss_parallel``: keep
    the logits split over the vocabulary (the loss and its backward must then run under
    ``torch.distributed.tensor.parallel.loss_parallel()``); returns whether it does."""
    family = family_of(model)
    loss_parallel = uses_loss_parallel(model, loss_parallel)
    family.plan(model, mesh, sequence_parallel, loss_parallel)
    replicate_rest(model, mesh)
    return loss_parallel


def replicate_rest(model: nn.Module, mesh: Any) -> None:
    """Make each parameter the plan did not split a ``Replicate`` DTensor on the tensor mesh, its
    module taking and returning local tensors. Why: the foreach optimizers refuse a parameter
    group mixing DTensors and plain tensors; with every parameter a DTensor the optimizer's
    steps are the engine's own, and a replicated norm fed sequence shards gets its gradient
    all-reduced exactly as DTensor does it (a ``Partial`` gradient)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor

    def partition(name: str, module: nn.Module, mesh_: Any) -> None:
        for key, param in list(module._parameters.items()):
            if param is not None and not isinstance(param, DTensor):
                module._parameters[key] = nn.Parameter(distribute_tensor(param, mesh_, [Replicate()]),
                                                       requires_grad=param.requires_grad)

    def to_dtensor(module: nn.Module, inputs: Any, mesh_: Any) -> Any:
        return tuple(DTensor.from_local(x, mesh_, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    def to_local(module: nn.Module, output: Any, mesh_: Any) -> Any:
        if isinstance(output, DTensor):
            return output.to_local()
        if isinstance(output, tuple):
            return tuple(o.to_local() if isinstance(o, DTensor) else o for o in output)
        return output

    for module in list(model.modules()):
        own = [p for p in module.parameters(recurse=False) if not isinstance(p, DTensor)]
        if own:
            distribute_module(module, mesh, lambda n, m, d, module=module: partition(n, m, d) if m is module else None,
                              to_dtensor, to_local)
