"""Whose kernels a layer of the traced step runs, where two libraries run the same layer
differently: PyTorch's own (SDPA's dispatcher, ``torch._grouped_mm``, torchao's float8 casts:
torchtitan's layouts and a single GPU) or NVIDIA's Transformer Engine (``DotProductAttention``,
``GroupedLinear``, its FP8 quantizers: the layers Megatron-LM's layouts run). The kernel models
take one of these names and pick that library's kernels and checks."""

PYTORCH = "pytorch"
TRANSFORMER_ENGINE = "transformer-engine"
