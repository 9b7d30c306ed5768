"""``measure.distributed``'s accumulated step on a real (one-rank gloo) process group: DDP
reduces the gradients once, in the last micro-batch's backward, as the plan times it. Run in a
process of its own: the default process group is the process's one."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

SCRIPT = r'''
import contextlib, sys
from types import SimpleNamespace
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from nnperf.measure.distributed import _accumulating

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
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
_accumulating(SimpleNamespace(step=step, run=lambda: model(*inputs).sum().backward()), 4)()
# the four micro-batches' gradients summed: 4 x the input's column sums for every output
expected = 4 * inputs[0].sum(0).expand(3, 4)
print(reductions, torch.allclose(model.module.weight.grad, expected))
dist.destroy_process_group()
'''


def test_ddp_reduces_in_the_last_micro_batch_only(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # one bucket (the weight's 12 elements and the bias's 3), reduced once; the sum right
    assert done.stdout.split() == ["[15]", "True"]
