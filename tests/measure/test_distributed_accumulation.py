"""``measure.distributed``'s accumulated step on a real (one-rank gloo) process group: DDP
reduces the gradients once, in the last micro-batch's backward, as the plan times it."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nnperf.measure.distributed import _accumulating


def test_ddp_reduces_in_the_last_micro_batch_only(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Linear(4, 3))
        reductions = []

        def count(_state, bucket):  # the bucket's reduction, counted and skipped
            reductions.append(bucket.buffer().numel())
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        model.register_comm_hook(None, count)
        inputs = (torch.randn(2, 4),)
        step = SimpleNamespace(model=model, inputs=inputs, loss_fn=lambda out: out.sum(), scaler=None,
                               autocast=contextlib.nullcontext, options=SimpleNamespace(sdpa="fused"))
        last = SimpleNamespace(step=step, run=lambda: model(*inputs).sum().backward())
        _accumulating(last, 4)()
        assert reductions == [4 * 3 + 3]  # one bucket (weight and bias), once
        # the four micro-batches' gradients summed: 4 x the input's column sums for every output
        expected = 4 * inputs[0].sum(0).expand(3, 4)
        torch.testing.assert_close(model.module.weight.grad, expected)
    finally:
        dist.destroy_process_group()
