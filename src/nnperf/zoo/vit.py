"""ViT-B/16 in torchvision's layout, with attention routed through SDPA.

torchvision uses ``nn.MultiheadAttention``; here ``self_attention`` keeps its parameter names
(``in_proj_weight``, ``in_proj_bias``, ``out_proj``) and count, but calls
``scaled_dot_product_attention`` directly so the tracer sees one attention op.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from nnperf.workload import Workload

from ._attention import attention, merge_heads, split_heads
from ._options import require_divisible, require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload

DEFAULTS: dict[str, Any] = {
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "mlp_dim": 3072,
    "patch_size": 16,
    "image_size": 224,
    "num_classes": 1000,
}
OPTIONS = {
    "n_layer": "number of encoder blocks",
    "n_embd": "hidden size",
    "n_head": "attention heads",
    "mlp_dim": "MLP hidden size",
    "patch_size": "patch height and width",
    "image_size": "input height and width (a multiple of patch_size)",
    "num_classes": "number of output classes",
}


class SelfAttention(nn.Module):
    """Multi-head self-attention with ``nn.MultiheadAttention``'s packed projection."""

    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.head_dim = dim // n_head
        self.in_proj_weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(3 * dim, dim)))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (split_heads(t, self.head_dim) for t in (q, k, v))
        return self.out_proj(merge_heads(attention(q, k, v, causal=False)))


class EncoderBlock(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, dim: int, n_head: int, mlp_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = SelfAttention(dim, n_head)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(  # torchvision's MLPBlock: indices 0 and 3 are the linears
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.dropout(self.self_attention(self.ln_1(x)))
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """Learned position embedding, the blocks (``encoder_layer_N``), final LayerNorm."""

    def __init__(self, seq: int, n_layer: int, dim: int, n_head: int, mlp_dim: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq, dim).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential()
        for i in range(n_layer):
            self.layers.add_module(f"encoder_layer_{i}", EncoderBlock(dim, n_head, mlp_dim))
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """``torchvision.models.VisionTransformer``: patchify, prepend class token, encode, head."""

    def __init__(self, image_size: int, patch_size: int, n_layer: int, dim: int, n_head: int,
                 mlp_dim: int, num_classes: int) -> None:  # fmt: skip
        super().__init__()
        self.patch_size = patch_size
        self.hidden_dim = dim
        self.conv_proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        seq = (image_size // patch_size) ** 2 + 1
        self.encoder = Encoder(seq, n_layer, dim, n_head, mlp_dim)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(dim, num_classes))
        # torchvision uses trunc_normal_, whose rejection loop is data-dependent and fails on
        # fake tensors; a plain normal with the same std is equivalent for performance work.
        nn.init.normal_(self.conv_proj.weight, std=math.sqrt(1 / (3 * patch_size**2)))

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).flatten(2).transpose(1, 2)  # (n, patches, dim)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        x = self.encoder(x)
        return self.heads(x[:, 0])


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Random RGB images; ``info['tokens_per_image']`` records the encoder sequence length."""
    batch, _ = resolve_batch_seq("vit_b_16", batch, seq_len, SPEC.default_batch, None)
    c = resolve_options("vit_b_16", overrides, DEFAULTS)
    require_positive("vit_b_16", c, *DEFAULTS)
    require_divisible("vit_b_16", c, "n_embd", "n_head")
    require_divisible("vit_b_16", c, "image_size", "patch_size")
    model = VisionTransformer(c["image_size"], c["patch_size"], c["n_layer"], c["n_embd"],
                              c["n_head"], c["mlp_dim"], c["num_classes"])  # fmt: skip
    w = image_workload("vit_b_16", model, batch, c["image_size"], c["num_classes"], c)
    w.info["tokens_per_image"] = (c["image_size"] // c["patch_size"]) ** 2 + 1
    return w


SPEC = ModelSpec(
    name="vit_b_16",
    summary="ViT-B/16 (torchvision layout, SDPA attention), 224x224 RGB, 1000 classes",
    family="vision-transformer",
    default_batch=64,
    default_seq=None,
    input_desc="3x224x224 float (197 tokens of 768)",
    options=OPTIONS,
    build=build,
)
