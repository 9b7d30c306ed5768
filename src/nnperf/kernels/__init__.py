"""Models of one kernel or transfer on one GPU, needing no trace.

``gemm``: cuBLAS-style tiles, waves and alignment for one matrix product; ``transfer``: one
host-device copy over the GPU's host link. Collective operations (all-reduce, all-gather,
reduce-scatter, all-to-all, send/recv) belong here as ``collectives``, beside them: each a
function of sizes and hardware, priced by the passes and searches that own a step.
"""
