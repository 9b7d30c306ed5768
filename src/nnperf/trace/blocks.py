"""A model's repeated blocks: the unit activation checkpointing recomputes, FSDP2 shards one
at a time, and FP8 training converts the linear layers of.

Found from the module tree alone (no model knowledge): children of a ModuleList/Sequential
that share their class with a sibling and have submodules (transformer layers, residual
blocks). Leaf layers (a VGG's convs) are not blocks: checkpointing them saves nothing.
"""

from __future__ import annotations

from collections import Counter

from torch import nn


def repeated_blocks(model: nn.Module) -> list[str]:
    """The names of ``model``'s repeated blocks, in module order."""
    blocks: list[str] = []

    def visit(prefix: str, module: nn.Module) -> None:
        children = list(module.named_children())
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            classes = Counter(type(c) for _, c in children)
            chosen = [n for n, c in children if classes[type(c)] > 1 and any(True for _ in c.children())]
            if chosen:
                blocks.extend(f"{prefix}{n}" for n in chosen)
                for n, c in children:
                    if n not in chosen:
                        visit(f"{prefix}{n}.", c)
                return
        for n, c in children:
            visit(f"{prefix}{n}.", c)

    visit("", model)
    return blocks


#: FP8 GEMMs need both dimensions of the weight to be multiples of 16 (cuBLASLt's FP8 matmul;
#: torchao's float8 conversion and Transformer Engine refuse other shapes).
FP8_ALIGNMENT = 16


#: The attribute that marks a repeated block while the model is whole (``mark_blocks``).
_BLOCK_MARK = "_nnperf_repeated_block"


def mark_blocks(model: nn.Module) -> None:
    """Mark ``model``'s repeated blocks while it is whole: a pipeline stage may hold one block
    per chunk, which alone is not a repeated one (``block_names``)."""
    modules = dict(model.named_modules())
    for name in repeated_blocks(model):
        setattr(modules[name], _BLOCK_MARK, True)


def block_names(model: nn.Module) -> list[str]:
    """The names, in ``model``, of its repeated blocks: those marked while the model was whole
    (``mark_blocks``), else those ``repeated_blocks`` finds."""
    marked = [name for name, m in model.named_modules() if getattr(m, _BLOCK_MARK, False)]
    return marked or repeated_blocks(model)


def linears_in_blocks(model: nn.Module) -> list[str]:
    """The names of the ``nn.Linear`` layers inside ``model``'s repeated blocks (``block_names``)
    that an FP8 GEMM can run: what Transformer Engine's layers replace in Megatron-LM's
    transformer layers and what torchao's float8 conversion takes in torchtitan (which leaves
    the output head out by default), less a mixture of experts' router (``is_router``)."""
    blocks = tuple(f"{b}." for b in block_names(model))
    modules = dict(model.named_modules())
    return [name for name, m in modules.items()
            if isinstance(m, nn.Linear) and name.startswith(blocks) and not is_router(name, modules)
            and m.in_features % FP8_ALIGNMENT == 0 and m.out_features % FP8_ALIGNMENT == 0]


def is_router(name: str, modules: dict[str, nn.Module]) -> bool:
    """Whether the linear layer ``name`` is the router of a mixture of experts: the ``gate`` of a
    module that holds ``experts`` (the zoo's MoE, transformers' Mixtral and Qwen3-MoE blocks).
    Neither engine runs it in FP8: Megatron-Core computes the router's logits outside Transformer
    Engine (``TopKRouter``, in fp32 with ``--moe-router-dtype fp32``), and torchtitan's MoE
    configurations leave it out of float8 (``filter_fqns = ["output", "router.gate"]``)."""
    parent, _, leaf = name.rpartition(".")
    return leaf == "gate" and hasattr(modules.get(parent), "experts")
