"""The two-stream replay of passes.comm_timeline on a step built by hand: an op waits for the
tensors it reads (on whichever stream they were produced), a collective runs on its own stream
beside the compute, the compute's wait is charged to the collective's kind, and a kernel
overlapping a collective runs slower by what the collective takes (SMs, DRAM bandwidth)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nnperf.passes.comm_timeline import Contention, SideStream, overlap
from nnperf.passes.fsdp_streams import ALL_GATHER_STREAM, COPY_IN_STREAM, REDUCE_SCATTER_STREAM
from nnperf.vocab import Category

MS = 1e-3
#: a side stream of some engine's that waits for no compute kernel, beside FSDP2's
ANOTHER = SideStream("another engine's stream", waits_for_compute=False)


def _op(index: int, name: str, reads: list[int], writes: list[int], seconds: float, comm: bool = False,
        memory_bound: bool = False, phase: str = "forward", category: Category | None = None,
        role: str = "forward"):
    """An op whose kernel takes ``seconds``: all compute (or all memory traffic), no overhead;
    a GEMM (``category``) of one ``role``."""
    event = SimpleNamespace(name=name, inputs=[SimpleNamespace(storage=s) for s in reads],
                            outputs=[SimpleNamespace(storage=s) for s in writes], phase=phase)
    kernel = 0.0 if comm else seconds
    return SimpleNamespace(index=index, count=SimpleNamespace(event=event), kernels=0 if comm else 1,
                           kernel_s=kernel, model_compute_s=0.0 if memory_bound else kernel,
                           model_memory_s=kernel if memory_bound else 0.0, overhead_s=0.0,
                           category=Category.COMMUNICATION if comm else category or Category.ELEMENTWISE,
                           gemms=[SimpleNamespace(gemm=SimpleNamespace(role=role))])


def _gemm(index: int, reads: list[int], writes: list[int], seconds: float, role: str = "forward"):
    return _op(index, "aten.mm", reads, writes, seconds, category=Category.GEMM, role=role)


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


@pytest.mark.parametrize("phase", ["optimizer", "forward", "backward"])
def test_a_collective_waits_for_the_kernels_issued_before_it(phase):
    """ZeRO-1's broadcast of another rank's share reads nothing this step wrote, but it is issued
    from the compute stream after the update (2 ms), and ProcessGroupNCCL's stream waits for
    what was issued there: it runs from 2 to 3 ms, exposed. So does any collective issued from
    the compute stream, whatever its phase."""
    ops = [_op(0, "_foreach_add_", [1], [1], 2 * MS, phase=phase),
           _op(1, "c10d.broadcast_", [0], [0], 0, comm=True, phase=phase)]
    result = overlap(_step(ops), None, lambda i: ("broadcast", 100, 1 * MS))
    assert result.step_s == pytest.approx(3 * MS)
    assert result.slices[0].start_s == pytest.approx(2 * MS)


def test_an_fsdp_all_gather_starts_when_its_input_is_ready():
    """FSDP2 issues its all-gathers from streams of its own (copy-in, then all-gather), which
    wait for no compute kernel: the gather starts at once, hidden under the 2 ms update."""
    ops = [_op(0, "_foreach_add_", [1], [1], 2 * MS), _op(1, "fsdp.all_gather_copy_in", [0], [2], 0),
           _op(2, "c10d._allgather_base_", [2], [3], 0, comm=True)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 1 * MS),
                     side_streams={1: COPY_IN_STREAM, 2: ALL_GATHER_STREAM})
    assert result.step_s == pytest.approx(2 * MS)
    assert result.slices[0].start_s == pytest.approx(0.0)


def test_an_input_gradient_all_reduce_waits_for_the_weight_gradient_issued_first():
    """Tensor parallelism's backward: autograd runs a linear's input-gradient GEMM (A, 1 ms)
    and its weight-gradient GEMM (B, 2 ms), then DTensor issues the all-reduce of the input
    gradient (2 ms); the norm's backward (C, 1 ms) reads it. The all-reduce starts after B (3 ms),
    not after A, so C waits from 3 to 5 ms: exposed."""
    ops = [_op(0, "mm", [0], [1], 1 * MS, phase="backward"), _op(1, "mm", [0], [2], 2 * MS, phase="backward"),
           _op(2, "_c10d_functional.all_reduce", [1], [3], 0, comm=True, phase="backward"),
           _op(3, "native_layer_norm_backward", [3], [4], 1 * MS, phase="backward")]
    result = overlap(_step(ops), None, lambda i: ("all_reduce", 100, 2 * MS))
    assert result.step_s == pytest.approx(6 * MS)
    assert result.exposed_s == pytest.approx({"all_reduce": 2 * MS})


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


def test_fsdp_copy_in_runs_beside_the_compute():
    # FSDP2's all-gather copy-in is on its copy-in stream: compute B does not wait for it
    ops = [_op(0, "fsdp.all_gather_copy_in", [0], [1], 3 * MS), _op(1, "b", [0], [2], 2 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 0, 0.0), side_streams={0: COPY_IN_STREAM})
    assert result.clock[1] == pytest.approx(2 * MS) and result.comm_s == pytest.approx(3 * MS)
    assert result.step_s == pytest.approx(3 * MS)


def test_a_kernel_free_wait_passes_the_collective_on_to_its_reader():
    # all-gather writes g (4 ms); the functional collective's wait_tensor returns w (no kernel;
    # a storage of its own here, so the pass must not rely on the wait aliasing the buffer); D
    # reads w: it waits for the all-gather, 4 ms exposed
    wait = _op(1, "_c10d_functional.wait_tensor", [1], [2], 0)
    wait.kernels, wait.category = 0, Category.HOST
    ops = [_op(0, "_c10d_functional.all_gather_into_tensor", [0], [1], 0, comm=True), wait,
           _op(2, "d", [2], [3], 1 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 4 * MS))
    assert result.exposed_s == pytest.approx({"all_gather": 4 * MS})
    assert result.step_s == pytest.approx(5 * MS) and result.compute_s == pytest.approx(1 * MS)


def test_a_kernel_runs_on_what_the_collective_leaves():
    # compute 8 ms and memory 2 ms plus 1 ms overhead, beside a collective holding a quarter of
    # the SMs and a fifth of the bandwidth: 8 / 0.75 = 10.67 ms of compute, 2 / 0.8 = 2.5 ms of
    # memory, so (10.67 + 1) / (8 + 1); a memory-bound kernel (memory 8, compute 2) (10 + 1) / 9
    taken = Contention(sm_share=0.25, dram_share=0.2)
    compute_bound = SimpleNamespace(model_compute_s=8 * MS, model_memory_s=2 * MS, overhead_s=1 * MS)
    memory_bound = SimpleNamespace(model_compute_s=2 * MS, model_memory_s=8 * MS, overhead_s=1 * MS)
    assert taken.slowdown(compute_bound) == pytest.approx((8 / 0.75 + 1) / 9)
    assert taken.slowdown(memory_bound) == pytest.approx((8 / 0.8 + 1) / 9)
    assert Contention(0.0, 0.0).slowdown(compute_bound) == 1.0


def test_the_overlapped_part_of_a_later_kernel_runs_slower():
    # A (1 ms) writes g; the all-reduce of g runs 1-3 ms holding half the SMs; B (compute-bound,
    # 4 ms alone) starts at 1 ms: 1 ms of its work in the 2 ms beside the all-reduce (twice as
    # slow), the other 3 ms alone after it: B ends at 6 ms, 1 ms later than alone
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "c10d.allreduce_", [1], [1], 0, comm=True),
           _op(2, "b", [0], [2], 4 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_reduce", 100, 2 * MS),
                     lambda i: Contention(sm_share=0.5, dram_share=0.0))
    assert result.step_s == pytest.approx(6 * MS) and result.slowdown_s == pytest.approx(1 * MS)
    assert result.compute_s == pytest.approx(6 * MS) and result.exposed_s == {}
    assert [(k, c) for k, c, _ in result.slowed] == [(2, 1)]  # B, stretched by the all-reduce
    assert result.slowed[0][2] == pytest.approx(1 * MS)
    # a memory-bound B is untouched by the SMs the collective holds
    ops[2] = _op(2, "b", [0], [2], 4 * MS, memory_bound=True)
    alone = overlap(_step(ops), None, lambda i: ("all_reduce", 100, 2 * MS),
                    lambda i: Contention(sm_share=0.5, dram_share=0.0))
    assert alone.step_s == pytest.approx(5 * MS) and alone.slowdown_s == 0.0


def test_a_collective_started_under_a_running_kernel_slows_its_rest():
    # B (compute-bound, 4 ms) is issued first and runs 0-4 ms; FSDP's all-gather of an
    # independent buffer (2 ms, half the SMs, on its own stream) is issued next and starts at 0:
    # B does 1 ms of work in those 2 ms and the remaining 3 ms alone, ending at 5 ms
    ops = [_op(0, "b", [0], [1], 4 * MS), _op(1, "fsdp.all_gather_copy_in", [2], [3], 0),
           _op(2, "c10d._allgather_base_", [3], [4], 0, comm=True)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 2 * MS),
                     lambda i: Contention(sm_share=0.5, dram_share=0.0), side_streams={1: COPY_IN_STREAM, 2: ALL_GATHER_STREAM})
    assert result.step_s == pytest.approx(5 * MS) and result.slowdown_s == pytest.approx(1 * MS)
    assert result.clock[0] == pytest.approx(5 * MS)


def test_a_kernel_beside_collectives_of_two_streams_is_never_sped_up():
    # gathers of two engines' side streams: X runs 0-2 ms; Y's copy-in takes 1 ms, so Y runs
    # 1-1.5 ms, inside X. B (compute-bound, 4 ms alone, half the SMs taken by either) runs 0-2 ms
    # at half speed (1 ms of work) and the other 3 ms alone: it ends at 5 ms, 1 ms late
    ops = [_op(0, "fsdp.all_gather_copy_in", [10], [11], 0), _op(1, "c10d._allgather_base_", [11], [12], 0, comm=True),
           _op(2, "fsdp.all_gather_copy_in", [13], [14], 1 * MS),
           _op(3, "c10d._allgather_base_", [14], [15], 0, comm=True), _op(4, "b", [0], [1], 4 * MS)]
    seconds = {1: 2 * MS, 3: 0.5 * MS}
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, seconds[i]),
                     lambda i: Contention(sm_share=0.5, dram_share=0.0), stream_of=lambda i: "x" if i < 2 else "y",
                     side_streams={0: COPY_IN_STREAM, 1: ALL_GATHER_STREAM, 2: ANOTHER, 3: ANOTHER})
    assert [t for c in result.slices for t in (c.start_s, c.end_s)] == pytest.approx([0, 2 * MS, 1 * MS, 1.5 * MS])
    assert result.clock[4] == pytest.approx(5 * MS) and result.slowdown_s == pytest.approx(1 * MS)


def test_no_contention_leaves_the_replay_as_it_was():
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "c10d.allreduce_", [1], [1], 0, comm=True),
           _op(2, "b", [0], [2], 4 * MS)]
    plain = overlap(_step(ops), None, lambda i: ("all_reduce", 100, 2 * MS))
    none = overlap(_step(ops), None, lambda i: ("all_reduce", 100, 2 * MS), lambda i: None)
    assert plain.step_s == none.step_s == pytest.approx(5 * MS) and none.slowdown_s == 0.0


def test_collectives_of_different_process_groups_run_at_once():
    # two 4 ms collectives after A (1 ms), then B reads both: on one stream (one group) B
    # starts at 9 ms; on two (two communicators, two NCCL streams) at 5 ms
    ops = [_op(0, "a", [0], [1, 2], 1 * MS), _op(1, "c10d._allgather_base_", [1], [3], 0, comm=True),
           _op(2, "_c10d_functional.all_to_all_single", [2], [4], 0, comm=True), _op(3, "b", [3, 4], [5], 1 * MS)]
    timed = lambda i: ("all_gather" if i == 1 else "all_to_all", 100, 4 * MS)  # noqa: E731
    same = overlap(_step(ops), None, timed, stream_of=lambda i: (0, 1))
    apart = overlap(_step(ops), None, timed, stream_of=lambda i: (0, 1) if i == 1 else (0, 2))
    assert same.step_s == pytest.approx(10 * MS) and same.exposed_s == pytest.approx({"all_to_all": 8 * MS})
    assert apart.step_s == pytest.approx(6 * MS)
    assert sum(apart.exposed_s.values()) == pytest.approx(4 * MS)


def test_fsdp_copy_in_runs_beside_another_groups_collective():
    # copy-in (3 ms) then its all-gather (2 ms) on group X; a 4 ms all-to-all on group Y issued
    # first runs beside them: the gather ends at 5 ms, not 9 ms
    ops = [_op(0, "_c10d_functional.all_to_all_single", [0], [1], 0, comm=True),
           _op(1, "fsdp.all_gather_copy_in", [6], [2], 3 * MS), _op(2, "c10d._allgather_base_", [2], [3], 0, comm=True),
           _op(3, "b", [3], [4], 1 * MS)]
    seconds = {0: 4 * MS, 2: 2 * MS}
    result = overlap(_step(ops), None, lambda i: ("x", 0, seconds[i]), stream_of=lambda i: "y" if i == 0 else "x",
                     side_streams={1: COPY_IN_STREAM, 2: ALL_GATHER_STREAM})
    assert result.clock[3] == pytest.approx(6 * MS)


def test_a_cast_feeding_the_copy_in_runs_on_its_stream_too():
    """FSDP2 under mixed precision casts the shards into a flat bf16 buffer on the copy-in stream
    before copying them into the all-gather buffer: the next layer's gather (C 0.5 ms, copy-in
    0.5 ms, all-gather 2 ms) runs beside the 4 ms layer issued before it, and the next layer
    (1 ms) starts at 4 ms, not after the 3 ms chain that starts when the layer ends (8 ms)."""
    ops = [_op(0, "layer", [0], [1], 4 * MS), _op(1, "aten._foreach_copy_", [5], [6], 0.5 * MS),
           _op(2, "fsdp.all_gather_copy_in", [6], [7], 0.5 * MS),
           _op(3, "c10d._allgather_base_", [7], [8], 0, comm=True), _op(4, "next", [1, 8], [9], 1 * MS)]
    timed = lambda i: ("all_gather", 100, 2 * MS)  # noqa: E731
    fsdp = {1: COPY_IN_STREAM, 2: COPY_IN_STREAM, 3: ALL_GATHER_STREAM}
    assert overlap(_step(ops), None, timed, side_streams=fsdp).step_s == pytest.approx(5 * MS)
    del fsdp[1]  # the cast on the compute stream: after the layer
    assert overlap(_step(ops), None, timed, side_streams=fsdp).step_s == pytest.approx(8 * MS)


def test_fsdp_gathers_of_two_groups_queue_on_its_all_gather_stream():
    """FSDP2 issues every group's all-gathers from its one all-gather stream (a MoE's expert
    group beside the dense one): copy-ins A and B (0.5 ms each, 0-1 ms on the copy-in stream),
    gathers A on group X and B on group Y (4 ms each), then C (1 ms) reads both. B waits for A
    (4.5-8.5 ms): C ends at 9.5 ms; a stream per communicator alone would run B at 1-5 ms."""
    ops = [_op(0, "fsdp.all_gather_copy_in", [10], [11], 0.5 * MS), _op(1, "c10d._allgather_base_", [11], [12], 0, comm=True),
           _op(2, "fsdp.all_gather_copy_in", [13], [14], 0.5 * MS), _op(3, "c10d._allgather_base_", [14], [15], 0, comm=True),
           _op(4, "c", [12, 15], [16], 1 * MS)]
    timed = lambda i: ("all_gather", 100, 4 * MS)  # noqa: E731
    groups = lambda i: "x" if i == 1 else "y"  # noqa: E731
    fsdp = {0: COPY_IN_STREAM, 1: ALL_GATHER_STREAM, 2: COPY_IN_STREAM, 3: ALL_GATHER_STREAM}
    result = overlap(_step(ops), None, timed, stream_of=groups, side_streams=fsdp)
    assert [t for c in result.slices for t in (c.start_s, c.end_s)] == pytest.approx([0.5 * MS, 4.5 * MS, 4.5 * MS, 8.5 * MS])
    assert result.step_s == pytest.approx(9.5 * MS)
    apart = {**fsdp, 3: ANOTHER}
    assert overlap(_step(ops), None, timed, stream_of=groups, side_streams=apart).step_s == pytest.approx(6 * MS)


def test_a_groups_gather_waits_for_its_reduce_scatter_on_another_fsdp_stream():
    """FSDP2's all-gather and reduce-scatter streams are two, but one group's collectives share
    its NCCL communicator, which runs them one at a time: A (1 ms) writes a gradient whose
    reduce-scatter (4 ms, group X) runs 1-5 ms; the next unit's gather on X (copy-in 0.5 ms,
    then 2 ms) runs 5-7 ms, and B (1 ms) reading it ends at 8 ms; on group Y it would run
    0.5-2.5 ms and B end at 3.5 ms."""
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "c10d._reduce_scatter_base_", [1], [2], 0, comm=True),
           _op(2, "fsdp.all_gather_copy_in", [10], [11], 0.5 * MS), _op(3, "c10d._allgather_base_", [11], [12], 0, comm=True),
           _op(4, "b", [12], [13], 1 * MS)]
    seconds = {1: 4 * MS, 3: 2 * MS}
    timed = lambda i: ("x", 100, seconds[i])  # noqa: E731
    fsdp = {1: REDUCE_SCATTER_STREAM, 2: COPY_IN_STREAM, 3: ALL_GATHER_STREAM}
    assert overlap(_step(ops), None, timed, stream_of=lambda i: "x", side_streams=fsdp).step_s == pytest.approx(8 * MS)
    other = overlap(_step(ops), None, timed, stream_of=lambda i: "x" if i == 1 else "y", side_streams=fsdp)
    assert other.step_s == pytest.approx(5 * MS)  # the reduce-scatter, still running, ends the step


def test_the_reduce_scatter_stream_waits_for_the_compute_issued_before_it():
    """``foreach_reduce`` makes the reduce-scatter stream wait for the compute stream: A (1 ms)
    writes the gradient, B (3 ms) is issued before the reduce-scatter (2 ms), which runs from
    4 ms, not from 1 ms, and ends the step at 6 ms."""
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "b", [0], [2], 3 * MS),
           _op(2, "c10d._reduce_scatter_base_", [1], [3], 0, comm=True)]
    result = overlap(_step(ops), None, lambda i: ("reduce_scatter", 100, 2 * MS), side_streams={2: REDUCE_SCATTER_STREAM})
    assert result.slices[0].start_s == pytest.approx(4 * MS) and result.step_s == pytest.approx(6 * MS)


def test_each_stretch_is_told_by_the_collective_beside_the_kernel():
    """Two collectives of two streams, one after the other beside one long kernel: A (1 ms)
    writes g and h; the all-reduce of g runs 1-3 ms holding half the SMs, the all-gather of h
    (another stream, issued after it) starts at 1 ms too and runs to 5 ms holding a fifth.
    B (compute-bound, 6 ms alone) starts at 1 ms: beside the all-reduce for 2 ms (1 ms of work,
    1 ms added), then beside the all-gather alone (2 ms: 1.6 ms of work, 0.4 ms added), then
    alone for the 3.4 ms left: it ends at 8.4 ms, the 1.4 ms added told 1 ms to the all-reduce
    and 0.4 ms to the all-gather."""
    ops = [_op(0, "a", [0], [1, 2], 1 * MS), _op(1, "c10d.allreduce_", [1], [1], 0, comm=True),
           _op(2, "c10d.allgather_", [2], [2], 0, comm=True), _op(3, "b", [0], [3], 6 * MS)]
    seconds, share = {1: 2 * MS, 2: 4 * MS}, {1: 0.5, 2: 0.2}
    result = overlap(_step(ops), None, lambda i: ("x", 100, seconds[i]),
                     lambda i: Contention(sm_share=share[i], dram_share=0.0), stream_of=lambda i: i)
    assert result.step_s == pytest.approx(8.4 * MS) and result.slowdown_s == pytest.approx(1.4 * MS)
    told = {collective: added for _, collective, added in result.slowed}
    assert told == pytest.approx({1: 1 * MS, 2: 0.4 * MS})
    assert {kernel for kernel, _, _ in result.slowed} == {3}


# --- a collective pipelined with its GEMM (Transformer Engine's userbuffers overlap) ---

def test_a_ring_exchange_all_gather_feeds_its_gemm_from_the_first_chunk():
    """An all-gather of 4 ms in 4 chunks before a GEMM of 8 ms: the GEMM starts with the rank's
    own chunk at 0 and its last chunk (2 ms) follows the last arrival at 4 ms: done at 8 ms,
    nothing exposed. Unpipelined the GEMM waits the 4 ms: 12 ms."""
    ops = [_op(0, "all_gather", [0], [1], 0, comm=True), _gemm(1, [1], [2], 8 * MS)]
    timed = lambda i: ("all_gather", 100, 4 * MS)  # noqa: E731
    assert overlap(_step(ops), None, timed).step_s == pytest.approx(12 * MS)
    result = overlap(_step(ops), None, timed, pipelined=lambda i: 4)
    assert result.step_s == pytest.approx(8 * MS) and result.exposed_s == {}


def test_a_slow_all_gather_holds_back_the_last_chunk_of_its_gemms():
    """A 10 ms all-gather in 4 chunks, a copy of 1 ms (DTensor's cat) and two GEMMs of 4 ms
    reading it (q and k: one fused GEMM in Transformer Engine), an unrelated op between them:
    the copy runs from 0 to 1 ms, q to 5, the other op to 6, k to 10, but the GEMMs' last chunk
    (8 / 4 = 2 ms) follows the last arrival at 10 ms: 12 ms, 2 ms exposed."""
    ops = [_op(0, "all_gather", [0], [1], 0, comm=True), _op(1, "aten.cat", [1], [2], 1 * MS, category=Category.MEMORY),
           _gemm(2, [2], [3], 4 * MS), _op(3, "aten.silu", [9], [4], 1 * MS), _gemm(4, [2], [5], 4 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 10 * MS), pipelined=lambda i: 4)
    assert result.step_s == pytest.approx(12 * MS)
    assert result.exposed_s == pytest.approx({"all_gather": 2 * MS})
    assert result.waits == [(4, 0, pytest.approx(2 * MS))]


def test_what_reads_a_pipelined_gemms_output_ends_the_pipeline():
    """The zoo's SwiGLU: the gate's GEMM (4 ms), its activation (1 ms, reading it), the up
    projection's GEMM (4 ms), all after a 10 ms all-gather in 4 chunks. Transformer Engine's
    fused GEMM has both projections before the activation; here the activation needs the gate's
    whole output, so the pipeline ends with the gate: it ends at 10 + 4 / 4 = 11 ms, the
    activation at 12, and the up projection, on the whole gathered tensor, at 16 ms."""
    ops = [_op(0, "all_gather", [0], [1], 0, comm=True), _gemm(1, [1], [2], 4 * MS),
           _op(2, "aten.silu", [2], [3], 1 * MS), _gemm(3, [1], [4], 4 * MS)]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 10 * MS), pipelined=lambda i: 4)
    assert result.clock[1] == pytest.approx(11 * MS) and result.step_s == pytest.approx(16 * MS)
    assert result.exposed_s == pytest.approx({"all_gather": 7 * MS})


def test_an_all_gather_with_other_work_before_its_gemm_is_not_pipelined():
    """Megatron-LM's regather, waited for later: another kernel runs first, so the GEMM waits
    for the whole all-gather (2 ms beside the 1 ms kernel: 1 ms exposed), pipelined or not."""
    ops = [_op(0, "all_gather", [0], [1], 0, comm=True), _op(1, "aten.mul", [5], [6], 1 * MS),
           _gemm(2, [1], [2], 3 * MS)]
    for pipelined in (None, lambda i: 4):
        result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 2 * MS), pipelined=pipelined)
        assert result.step_s == pytest.approx(5 * MS)
        assert result.exposed_s == pytest.approx({"all_gather": 1 * MS})


@pytest.mark.parametrize("weight_first", [False, True])
def test_a_weight_gradient_reading_the_gathered_tensor_waits_for_all_of_it(weight_first):
    """Backward of a row-parallel linear: the gathered output gradient (4 ms, 2 chunks) feeds
    the input gradient's GEMM (2 ms), pipelined, and the weight gradient's (6 ms), which
    Transformer Engine runs after it on the whole tensor: 4 + 2 / 2 + 6 = 11 ms, 3 ms exposed,
    in either order (PyTorch's mm backward, as DTensor's row-parallel linear runs it, computes
    the weight gradient first)."""
    dgrad, wgrad = _gemm(1, [1, 7], [2], 2 * MS, role="grad_input"), _gemm(2, [1, 8], [3], 6 * MS, role="grad_weight")
    if weight_first:
        dgrad.index, wgrad.index = 2, 1
    ops = [_op(0, "all_gather", [0], [1], 0, comm=True), *((wgrad, dgrad) if weight_first else (dgrad, wgrad))]
    result = overlap(_step(ops), None, lambda i: ("all_gather", 100, 4 * MS), pipelined=lambda i: 2)
    assert result.step_s == pytest.approx(11 * MS)
    assert result.exposed_s == pytest.approx({"all_gather": 3 * MS})


def _reduce_scatter_both_ways(ops, seconds: float, chunks: int):
    """The replay of ``ops`` with their reduce-scatter of ``seconds`` after its GEMM, and
    pipelined with it in ``chunks``."""
    timed = lambda i: ("reduce_scatter", 100, seconds)  # noqa: E731
    return overlap(_step(ops), None, timed), overlap(_step(ops), None, timed, pipelined=lambda i: chunks)


def test_a_pipelined_reduce_scatter_follows_its_gemm_chunk_by_chunk():
    """A GEMM of 8 ms, DTensor's copy (1 ms), a 4 ms reduce-scatter in 4 chunks, then its
    reader: the reduce-scatter starts after the GEMM's first chunk (2 ms), its last chunk
    (1 ms) after the GEMM's last: done at 9 ms, the copy ends at 9 too: nothing exposed.
    Unpipelined it runs 9 to 13 ms: 4 ms exposed."""
    ops = [_gemm(0, [0], [1], 8 * MS), _op(1, "aten.cat", [1], [2], 1 * MS, category=Category.MEMORY),
           _op(2, "reduce_scatter", [2], [3], 0, comm=True), _op(3, "aten.add", [3], [4], 1 * MS)]
    plain, result = _reduce_scatter_both_ways(ops, 4 * MS, chunks=4)
    assert plain.step_s == pytest.approx(14 * MS) and plain.exposed_s == pytest.approx({"reduce_scatter": 4 * MS})
    assert result.slices[0].start_s == pytest.approx(2 * MS) and result.slices[0].end_s == pytest.approx(9 * MS)
    assert result.step_s == pytest.approx(10 * MS) and result.exposed_s == {}


def test_a_reduce_scatter_summed_on_the_compute_stream_delays_what_follows():
    """torch's async tensor parallelism: the same GEMM, copy and 4 ms reduce-scatter in 4
    chunks (done at 9 ms, as above), then the compute stream sums the partial chunks (1.5 ms,
    9 to 10.5 ms) before anything after the fused op runs, even a kernel (1 ms) that does not
    read the result (the stream waits for the copies): 10.5 to 11.5 ms. The copy ended at 9 ms,
    with the last chunk: nothing exposed; with a 0.5 ms copy the stream is free at 8.5 ms and
    waits 0.5 ms."""
    ops = [_gemm(0, [0], [1], 8 * MS), _op(1, "aten.cat", [1], [2], 1 * MS, category=Category.MEMORY),
           _op(2, "reduce_scatter", [2], [3], 0, comm=True), _op(3, "aten.mul", [0], [5], 1 * MS)]
    timed = lambda i: ("reduce_scatter", 100, 4 * MS)  # noqa: E731
    result = overlap(_step(ops), None, timed, pipelined=lambda i: 4, reduced_after=lambda i: 1.5 * MS)
    assert result.step_s == pytest.approx(11.5 * MS) and result.exposed_s == {}
    assert result.compute_s == pytest.approx((8 + 1 + 1.5 + 1) * MS)
    ops[1] = _op(1, "aten.cat", [1], [2], 0.5 * MS, category=Category.MEMORY)
    result = overlap(_step(ops), None, timed, pipelined=lambda i: 4, reduced_after=lambda i: 1.5 * MS)
    assert result.step_s == pytest.approx(11.5 * MS)
    assert result.exposed_s == pytest.approx({"reduce_scatter": 0.5 * MS})


def test_the_sum_waits_after_what_the_collective_slowed():
    """With contention: a 2 ms GEMM, then an 8 ms reduce-scatter in 4 chunks beside it, taking
    half the SMs, summed on the compute stream (1.5 ms), then a 1 ms kernel. The reduce-scatter
    runs from the GEMM's first chunk (0.5 ms) to 8.5 ms; the GEMM's last 1.5 ms beside it take
    twice as long (compute free at 3.5 ms, 1.5 ms slowed); the stream then waits for the last
    chunk (5 ms exposed), sums to 10 ms, and runs the kernel to 11 ms."""
    ops = [_gemm(0, [0], [1], 2 * MS), _op(1, "reduce_scatter", [1], [2], 0, comm=True),
           _op(2, "aten.mul", [0], [3], 1 * MS)]
    result = overlap(_step(ops), None, lambda i: ("reduce_scatter", 100, 8 * MS),
                     lambda i: Contention(sm_share=0.5, dram_share=0.0), pipelined=lambda i: 4,
                     reduced_after=lambda i: 1.5 * MS)
    assert result.slowdown_s == pytest.approx(1.5 * MS)
    assert result.exposed_s == pytest.approx({"reduce_scatter": 5 * MS})
    assert result.step_s == pytest.approx(11 * MS)


def test_an_input_gradient_is_reduce_scattered_beside_the_weight_gradient():
    """Megatron-LM's column-parallel backward: the input gradients of two linears (2 ms each),
    then the weight gradient (5 ms), then the input gradients added (1 ms) and DTensor's cat
    (1 ms). The reduce-scatter (4 ms, one piece) starts when the last input-gradient GEMM ends
    (4 ms), beside the weight gradient, and ends at 8 ms; its reader runs after the cat, 11 to
    12 ms, nothing exposed. Unpipelined it starts after the cat: 11 to 15 ms, 4 ms exposed."""
    ops = [_gemm(0, [0], [1], 2 * MS, role="grad_input"), _gemm(1, [0], [2], 2 * MS, role="grad_input"),
           _gemm(2, [0], [9], 5 * MS, role="grad_weight"), _op(3, "aten.add_", [1, 2], [1], 1 * MS),
           _op(4, "aten.cat", [1], [3], 1 * MS, category=Category.MEMORY),
           _op(5, "reduce_scatter", [3], [4], 0, comm=True, phase="backward"), _op(6, "aten.mul", [4], [5], 1 * MS)]
    plain, result = _reduce_scatter_both_ways(ops, 4 * MS, chunks=1)
    assert plain.step_s == pytest.approx(16 * MS) and plain.exposed_s == pytest.approx({"reduce_scatter": 4 * MS})
    assert result.slices[0].start_s == pytest.approx(4 * MS) and result.slices[0].end_s == pytest.approx(8 * MS)
    assert result.step_s == pytest.approx(12 * MS) and result.exposed_s == {}


def test_a_reduce_scatter_of_something_no_gemm_wrote_is_not_pipelined():
    ops = [_gemm(0, [0], [1], 4 * MS), _op(1, "aten.gelu", [1], [2], 2 * MS),
           _op(2, "reduce_scatter", [2], [3], 0, comm=True), _op(3, "aten.add", [3], [4], 1 * MS)]
    timed = lambda i: ("reduce_scatter", 100, 3 * MS)  # noqa: E731
    assert (overlap(_step(ops), None, timed, pipelined=lambda i: 4).step_s
            == pytest.approx(overlap(_step(ops), None, timed).step_s) == pytest.approx(10 * MS))



def test_a_gather_waits_for_the_copy_out_its_stream_was_made_to_wait_for():
    """FSDP2's rate limit: a gather's streams wait for an earlier copy-out (A, 2 ms, compute).
    The copy-in (0.5 ms) and the gather (1 ms), issued at once and waiting for nothing else,
    run at 2-2.5 and 2.5-3.5 ms; B (1 ms) reads the gather: it waits from 2 to 3.5 ms (without
    the wait, the gather runs at 0.5-1.5 ms, under A)."""
    ops = [_op(0, "fsdp.split_with_sizes_copy", [0], [1], 2 * MS), _op(1, "fsdp.all_gather_copy_in", [5], [6], 0.5 * MS),
           _op(2, "c10d._allgather_base_", [6], [7], 0, comm=True), _op(3, "b", [7], [8], 1 * MS)]
    fsdp = {1: COPY_IN_STREAM, 2: ALL_GATHER_STREAM}
    timed = lambda i: ("all_gather", 100, 1 * MS)  # noqa: E731
    result = overlap(_step(ops), None, timed, side_streams=fsdp, event_waits={1: 0, 2: 0})
    assert result.slices[0].start_s == pytest.approx(2.5 * MS) and result.step_s == pytest.approx(4.5 * MS)
    assert result.exposed_s == pytest.approx({"all_gather": 1.5 * MS})
    assert overlap(_step(ops), None, timed, side_streams=fsdp).step_s == pytest.approx(3 * MS)


def test_a_kernel_waiting_for_a_collective_is_charged_to_it():
    """FSDP2's next reduction waits for the reduce-scatter before it: A (1 ms) writes a gradient,
    its reduce-scatter runs 1-5 ms; the next unit's fill C (1 ms), which reads nothing of it,
    waits from 2 ms (after B, 1 ms) to 5 ms: 3 ms exposed, charged to the reduce-scatter."""
    ops = [_op(0, "a", [0], [1], 1 * MS), _op(1, "c10d._reduce_scatter_base_", [1], [2], 0, comm=True),
           _op(2, "b", [0], [3], 1 * MS), _op(3, "fsdp.chunk_cat", [3], [4], 1 * MS)]
    result = overlap(_step(ops), None, lambda i: ("reduce_scatter", 100, 4 * MS),
                     side_streams={1: REDUCE_SCATTER_STREAM}, event_waits={3: 1})
    assert result.step_s == pytest.approx(6 * MS) and result.exposed_s == pytest.approx({"reduce_scatter": 3 * MS})
    assert result.waits == [(3, 1, pytest.approx(3 * MS))]
