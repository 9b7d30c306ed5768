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


def linears_in_blocks(model: nn.Module) -> list[str]:
    """The names of the ``nn.Linear`` layers inside ``model``'s repeated blocks: what
    Transformer Engine's layers replace in Megatron-LM's transformer layers and what torchtao's
    float8 conversion takes in torchtitan (which leaves the output head out by default)."""
    blocks = tuple(f"{b}." for b in repeated_blocks(model))
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.startswith(blocks)]
