"""The two-stream replay of passes.comm_timeline on a step built by hand: an op waits for the
tensors it reads (on whichever stream they were produced), a collective runs on its own stream
beside the compute, and the compute's wait is charged to the collective's kind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nnperf.passes.comm_timeline import overlap
from nnperf.vocab import Category

MS = 1e-3


def _op(index: int, name: str, reads: list[int], writes: list[int], seconds: float, comm: bool = False):
    event = SimpleNamespace(name=name, inputs=[SimpleNamespace(storage=s) for s in reads],
                            outputs=[SimpleNamespace(storage=s) for s in writes])
    return SimpleNamespace(index=index, count=SimpleNamespace(event=event), kernels=0 if comm else 1,
                           kernel_s=0.0 if comm else seconds,
                           category=Category.COMMUNICATION if comm else Category.ELEMENTWISE)


def _step(ops, host_s: float = 0.0):
    slices = [SimpleNamespace(index=o.index, end_s=0.0) for o in ops]  # all issued at once
    return SimpleNamespace(ops=ops, host_slices=slices, host_s=host_s)


def test_an_op_waits_for_the_collective_that_wrote_its_input():
    # A writes g (1 ms); all-reduce of g (5 ms, comm stream); B independent (2 ms); C reads g (1 ms)
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "c10d.allreduce_", [1], [1], 0, comm=True),
           _op(2, "b", [0], [2], 2 * MS), _op(3, "c", [1], [3], 1 * MS)]
    seconds = {1: 5 * MS}
    result = overlap(_step(ops), None, lambda i: ("all_reduce", 100, seconds[i]))
    # the all-reduce starts when A is done (1 ms) and ends at 6 ms; B runs meanwhile (1-3 ms);
    # C waits from 3 to 6 ms: 3 ms exposed, charged to all_reduce; the step ends at 7 ms
    assert result.step_s == pytest.approx(7 * MS)
    assert result.exposed_s == pytest.approx({"all_reduce": 3 * MS})
    assert result.compute_s == pytest.approx(4 * MS) and result.comm_s == pytest.approx(5 * MS)
    assert result.clock[3] == pytest.approx(7 * MS) and result.clock[2] == pytest.approx(3 * MS)


def test_a_collective_nobody_waits_for_is_hidden_until_the_step_ends():
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "c10d.allreduce_", [1], [1], 0, comm=True),
           _op(2, "b", [0], [2], 10 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_reduce", 100, 5 * MS))
    assert result.step_s == pytest.approx(11 * MS) and result.exposed_s == {}


def test_a_collective_still_running_at_the_end_is_exposed():
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "c10d._reduce_scatter_base_", [1], [2], 0, comm=True),
           _op(2, "b", [0], [3], 1 * MS)]
    result = overlap(_step(ops), None, lambda i: ("reduce_scatter", 100, 5 * MS))
    # compute ends at 2 ms, the reduce-scatter at 6 ms: 4 ms exposed
    assert result.step_s == pytest.approx(6 * MS)
    assert result.exposed_s == pytest.approx({"reduce_scatter": 4 * MS})


def test_fsdp_copy_in_runs_on_the_communication_stream():
    # FSDP2's all-gather copy-in is on the all-gather stream: compute B does not wait for it
    ops = [_op(0, "fsdp.all_gather_copy_in", [0], [1], 3 * MS), _op(1, "b", [0], [2], 2 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 0, 0.0))
    assert result.clock[1] == pytest.approx(2 * MS) and result.comm_s == pytest.approx(3 * MS)
    assert result.step_s == pytest.approx(3 * MS)


def test_a_kernel_free_wait_passes_the_collective_on_to_its_reader():
    # all-gather writes g (4 ms); the functional collective's wait_tensor returns w (no kernel,
    # a new storage in a fake trace); D reads w: it waits for the all-gather, 4 ms exposed
    wait = _op(1, "_c10d_functional.wait_tensor", [1], [2], 0)
    wait.kernels, wait.category = 0, Category.HOST
    ops = [_op(0, "_c10d_functional.all_gather_into_tensor", [0], [1], 0, comm=True), wait,
           _op(2, "d", [2], [3], 1 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 4 * MS))
    assert result.exposed_s == pytest.approx({"all_gather": 4 * MS})
    assert result.step_s == pytest.approx(5 * MS) and result.compute_s == pytest.approx(1 * MS)
