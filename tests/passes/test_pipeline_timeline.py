"""The pipeline replay against the closed forms of Narayanan et al. 2021 ("Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", section 2.2): with p stages, m
micro-batches and uniform forward/backward times t_f, t_b and free transfers, GPipe and 1F1B take
(m + p - 1)(t_f + t_b), the bubble being (p - 1)(t_f + t_b) per rank; interleaving v chunks per
rank (each 1/v of the work) cuts the bubble to (p - 1)(t_f + t_b)/v."""

from __future__ import annotations

import pytest

from nnperf.passes.pipeline_timeline import (
    Action,
    in_flight,
    joint_pairs,
    orders,
    simulate,
    single_stage_order,
)


def _uniform(order, stages, f, b, p2p=0.0):
    return simulate(order, stages, lambda r, a: f if a.kind == "F" else b, lambda s, t: p2p)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4), (8, 32), (4, 1), (4, 2), (8, 3)])
def test_single_stage_schedules_match_the_closed_form(schedule, p, m):
    """Fewer micro-batches than stages too (Megatron-LM's 1F1B runs them: every forward first)."""
    f, b = 1.0, 2.0
    result = _uniform(orders(schedule, p, m, None), p, f, b)
    assert result.step_s == pytest.approx((m + p - 1) * (f + b))
    for rank in range(p):
        assert result.bubble_s[rank] == pytest.approx((p - 1) * (f + b))
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_interleaving_divides_the_bubble_by_the_chunks():
    """Interleaved 1F1B with torch's own order (p=4, v=2, m=8): each chunk half the work."""
    from torch.distributed.pipelining.schedules import _ComputationType  # noqa: F401 (torch has it)

    p, v, m, f, b = 4, 2, 8, 1.0, 2.0
    ir = _interleaved_ir(p, v, m)
    result = _uniform(orders("interleaved-1f1b", p, m, ir), p * v, f / v, b / v)
    assert result.bubble_s[0] == pytest.approx((p - 1) * (f + b) / v)
    assert result.step_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def _interleaved_ir(p: int, v: int, m: int) -> dict[int, list[str]]:
    """torch's pipeline_order of ScheduleInterleaved1F1B (built without a process group)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    schedule = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = p, v, m
    schedule.number_of_rounds = max(1, m // p)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    orders_ = {r: schedule._calculate_single_rank_operations(r) for r in range(p)}
    return {r: [str(a) for a in acts if a is not None] for r, acts in orders_.items()}


def test_transfers_add_to_the_critical_path():
    """GPipe with a transfer of c between stages: the last micro-batch's forward crosses p - 1
    links and its backward p - 1 back."""
    p, m, f, b, c = 4, 4, 1.0, 2.0, 0.25
    result = _uniform(orders("gpipe", p, m, None), p, f, b, p2p=c)
    assert result.step_s == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c)


def test_blocking_sends_hold_the_sender_until_they_arrive():
    """1F1B on two stages, two micro-batches (rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1); forward
    1, backward 2, a transfer 0.5. Overlapped sends: rank 0 F0 0-1, F1 1-2; rank 1 F0 1.5-2.5, B0
    2.5-4.5, F1 4.5-5.5, B1 5.5-7.5; rank 0 B0 5.0-7.0, B1 8.0-10.0. Blocking sends (Megatron-LM's
    1F1B): rank 0 is held after each forward (F0 0-1 until 1.5, F1 1.5-2.5 until 3.0); rank 1
    runs F0 1.5-2.5, B0 2.5-4.5 held until 5.0, F1 5.0-6.0, B1 6.0-8.0 held until 8.5; rank 0 B0
    5.0-7.0, B1 8.5-10.5. Each rank is held twice: 1.0, neither its work nor its bubble."""
    order = orders("1f1b", 2, 2, None)

    def run(blocking):
        return simulate(order, 2, lambda r, a: 1.0 if a.kind == "F" else 2.0, lambda s, t: 0.5,
                        blocking_sends=blocking)

    overlapped, blocking = run(False), run(True)
    assert overlapped.step_s == pytest.approx(10.0)
    assert overlapped.blocked_s == {0: 0.0, 1: 0.0}
    assert blocking.step_s == pytest.approx(10.5)
    assert blocking.blocked_s == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}
    assert blocking.busy_s == {0: pytest.approx(6.0), 1: pytest.approx(6.0)}
    assert blocking.bubble_s == {0: pytest.approx(10.5 - 6.0 - 1.0), 1: pytest.approx(10.5 - 6.0 - 1.0)}
    assert blocking.bubble_fraction == pytest.approx(3.5 / 10.5)
    # each rank sends twice either way (rank 0 its activations, rank 1 their gradients)
    assert overlapped.sent_s == blocking.sent_s == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}


def test_in_flight_micro_batches_per_stage():
    """1F1B keeps p - r micro-batches alive on rank r, GPipe all m (Narayanan et al. 2021)."""
    p, m = 4, 8
    for r in range(p):
        labels = [a.label for a in single_stage_order("1f1b", r, p, m)]
        assert in_flight(labels) == {r: p - r}
        assert in_flight([a.label for a in single_stage_order("gpipe", r, p, m)]) == {r: m}


def test_the_split_is_the_busiest_ranks_whichever_ends_last():
    """An uneven 1F1B pipeline of 4 stages and 8 micro-batches whose first stage does a quarter
    of the others' work (a dense first stage before mixture-of-experts ones): rank 0 ends last,
    as in every 1F1B, but idles most of its schedule waiting for the others; the split's rank is
    a heavy one, busy for all its 8 forwards and backwards, idle for under a third of its
    schedule (the pipeline's fill and drain)."""
    p, m = 4, 8
    work = {0: 0.25, 1: 1.0, 2: 1.0, 3: 1.0}  # forward times; a backward is twice
    result = simulate(orders("1f1b", p, m, None), p, lambda r, a: work[r] * (1 if a.kind == "F" else 2),
                      lambda s, t: 0.0)
    ends = result.end_s
    assert max(ends, key=ends.get) == 0  # the first stage's last backward ends the schedule
    assert result.critical_rank in (1, 2, 3)
    assert result.busy_s[result.critical_rank] == pytest.approx(m * 3.0)
    assert result.bubble_fraction < 1 / 3 < result.bubble_s[0] / (result.busy_s[0] + result.bubble_s[0])


def test_a_joint_backward_and_forward_run_as_one_step_and_send_when_it_ends():
    """Two stages, forward 1 and backward 2, free transfers; rank 0 runs each backward beside the
    forward after it, saving 0.5 (Megatron-Core's expert overlap), rank 1 does not. Worked by hand:
    rank 0 F0 [0, 1], F1 [1, 2]; rank 1 F0 [1, 2], B0 [2, 4], F1 [4, 5], B1 [5, 7]; rank 0's B0
    waits for rank 1's (4) and runs with F2 as one step [4, 6.5], F2's output leaving at 6.5;
    rank 0 B1 [7, 9]; rank 1 F2 [7, 8], B2 [8, 10]; rank 0 B2 [10, 12]."""
    def acts(labels: str) -> list[Action]:
        return [Action(label[0], int(label[1]), int(label[3])) for label in labels.split()]

    order = {0: acts("F0@0 F1@0 B0@0 F2@0 B1@0 B2@0"), 1: acts("F0@1 B0@1 F1@1 B1@1 F2@1 B2@1")}
    result = simulate(order, 2, lambda r, a: 1.0 if a.kind == "F" else 2.0, lambda s, t: 0.0,
                      joint=lambda rank, b, f: 0.5 if rank == 0 else 0.0)
    assert result.step_s == pytest.approx(12.0)
    assert result.starts["B0@0"] == result.starts["F2@0"] == pytest.approx(4.0)
    assert result.starts["F2@1"] == pytest.approx(7.0)
    assert result.busy_s[0] == pytest.approx(1 + 1 + 2.5 + 2 + 2)
    assert result.joint_s == {0: pytest.approx(0.5), 1: 0.0}
    # a forward's activations live beside the backward it runs with: one more in flight
    assert [a.label for a in joint_pairs(order[0])] == ["F0@0", "F1@0", "F2@0", "B0@0", "B1@0", "B2@0"]
    assert in_flight([a.label for a in joint_pairs(order[0])])[0] == in_flight([a.label for a in order[0]])[0] + 1
