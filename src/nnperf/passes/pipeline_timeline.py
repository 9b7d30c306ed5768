"""A pipeline schedule's step time, replayed from each stage's traced action times.

Every rank runs its schedule's actions in order (``F`` forward of a micro-batch, ``B`` its full
backward, ``I`` the input gradients only, ``W`` the weight gradients of zero-bubble schedules).
An action starts when its rank is free and its input has arrived: a stage's forward needs the
previous stage's forward of the same micro-batch plus the point-to-point transfer of the
activation; a backward (``B``/``I``) needs the next stage's backward of the micro-batch plus the
transfer of the gradient (the last stage: its own forward and loss); ``W`` follows its ``I`` on
the same rank. The action times come from the traced rank that holds the stage (the comm
timeline of its trace: compute, exposed tensor-parallel communication, host), the transfers from
the collectives model. What a rank waits for is the pipeline bubble, explicit: per rank, the
time inside the schedule that is neither its actions nor anything after them.

Sends either run beside the next action (torch's schedules post ``isend`` and wait for them
later; Megatron-LM's interleaved schedule with its default ``--overlap-p2p-communication``) or
hold the sending rank until they arrive (``blocking_sends``: Megatron-LM's non-interleaved 1F1B,
whose ``send_forward``, ``send_backward`` and their batched ``send_*_recv_*`` forms call
``_communicate`` with ``wait_on_reqs=True`` in megatron/core/pipeline_parallel/
p2p_communication.py, and DeepSpeed's pipeline engine, whose sends are synchronous): then the
rank's next action starts no earlier than its send's end, and that wait is the rank's blocked
time, neither its actions nor its bubble. A send is held for its transfer alone: NCCL's wait
for the receiver to post its receive is not modelled (the receiver's readiness is).

Megatron-Core's expert overlap (``--overlap-moe-expert-parallel-comm``, ``joint``) runs a
backward and the forward that follows it on its rank as one step, whose outputs leave when it
ends: it starts once both inputs are there and takes the two less what their layers' overlap
saves (``search.plan.expert_overlap``). Megatron-Core's interleaved schedule runs one forward
more before its first backward for it, so that each step's forward and backward are
independent: torch's order, whose steady state runs a forward then a backward, pairs the same
actions where each backward is paired with the forward after it.

The action order per rank is the engine's: ``pipeline_order`` of the multi-stage schedules (what
``_PipelineScheduleRuntime`` executes), and for the single-stage ones the loop of
``ScheduleGPipe._step_microbatches`` (all forwards, then all backwards) and
``Schedule1F1B._step_microbatches`` (``min(M, p - r)`` warm-up forwards, then one backward and
one forward alternately, then the remaining backwards); the tests check both against the
actions a real gloo run executes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

_LABEL = re.compile(r"^([FBIW])(\d+)@(\d+)$")  # F3@1: kind, micro-batch, stage
_IR = re.compile(r"^(\d+)([FBIW])(\d+)$")  # torch's _Action string: stage, kind, micro-batch


@dataclass(frozen=True)
class Action:
    kind: str  # F | B | I | W
    micro: int
    stage: int

    @property
    def label(self) -> str:
        return f"{self.kind}{self.micro}@{self.stage}"


def parse(label: str) -> Action | None:
    """An action from a trace label (``F3@1``) or torch's IR string (``1F3``); None for the
    IR's other actions (communication, gradient reduction)."""
    m = _LABEL.match(label)
    if m:
        return Action(m.group(1), int(m.group(2)), int(m.group(3)))
    m = _IR.match(label)
    if m:
        return Action(m.group(2), int(m.group(3)), int(m.group(1)))
    return None


def single_stage_order(schedule: str, rank: int, pipeline: int, micro: int) -> list[Action]:
    """The actions rank ``rank`` runs under GPipe or 1F1B (one stage per rank)."""
    if schedule == "gpipe":
        return [Action("F", m, rank) for m in range(micro)] + [Action("B", m, rank) for m in range(micro)]
    warmup = min(micro, pipeline - rank)
    order = [Action("F", m, rank) for m in range(warmup)]
    forward, backward = warmup, 0
    while forward < micro:
        order += [Action("B", backward, rank), Action("F", forward, rank)]
        forward, backward = forward + 1, backward + 1
    order += [Action("B", m, rank) for m in range(backward, micro)]
    return order


def orders(schedule: str, pipeline: int, micro: int, ir: dict[int, list[str]] | None) -> dict[int, list[Action]]:
    """Every pipeline rank's actions, in order."""
    if schedule in ("gpipe", "1f1b"):
        return {r: single_stage_order(schedule, r, pipeline, micro) for r in range(pipeline)}
    if not ir:
        raise ValueError(f"{schedule}: the schedule's pipeline_order is needed")
    return {int(r): [a for a in map(parse, labels) if a is not None] for r, labels in ir.items()}


def in_flight(labels: list[str]) -> dict[int, int]:
    """Per stage, the most micro-batches whose forward ran and whose backward (``B`` or ``I``)
    has not: the activations a stage keeps alive at once."""
    live: dict[int, int] = {}
    peak: dict[int, int] = {}
    for action in filter(None, map(parse, labels)):
        if action.kind == "F":
            live[action.stage] = live.get(action.stage, 0) + 1
            peak[action.stage] = max(peak.get(action.stage, 0), live[action.stage])
        elif action.kind in ("B", "I"):
            live[action.stage] = live.get(action.stage, 0) - 1
    return peak


@dataclass
class PipelineTime:
    step_s: float  # the slowest rank: its schedule plus what follows it (optimizer, gradient sync)
    busy_s: dict[int, float]  # per rank: the sum of its action times
    bubble_s: dict[int, float]  # per rank: idle time until the schedule's last action ends
    end_s: dict[int, float]  # per rank: when its last action ends
    #: the busiest rank (its actions and the sends that held it): the stage the others wait
    #: for, whose time the step's split reports (the rank whose schedule ends last is the
    #: first stage in 1F1B however light it is: an uneven pipeline's dense first stage)
    critical_rank: int
    starts: dict[str, float] = field(default_factory=dict)  # action label -> start time
    #: per rank: its sends' transfer time, overlapped or waited for
    sent_s: dict[int, float] = field(default_factory=dict)
    sends_block: bool = False  # ``simulate``'s blocking_sends: each send held its rank
    #: per rank: what its joint steps saved (``simulate``'s ``joint``), inside ``busy_s``
    joint_s: dict[int, float] = field(default_factory=dict)

    @property
    def blocked_s(self) -> dict[int, float]:
        """Per rank: the time its own sends held it."""
        return _held(self.sent_s, self.sends_block)

    @property
    def bubble_fraction(self) -> float:
        r = self.critical_rank
        span = self.busy_s[r] + self.bubble_s[r] + self.blocked_s.get(r, 0.0)
        return self.bubble_s[r] / span if span else 0.0


def simulate(order: dict[int, list[Action]], num_stages: int, duration: Callable[[int, Action], float],
             transfer: Callable[[int, int], float], head: Callable[[int], float] | None = None,
             tail: Callable[[int], float] | None = None, blocking_sends: bool = False,
             joint: Callable[[int, Action, Action], float] | None = None) -> PipelineTime:
    """Replay the schedule. ``duration(rank, action)``: the action's time on its rank;
    ``transfer(from_stage, to_stage)``: a micro-batch's activation or gradient transfer;
    ``head``/``tail(rank)``: the rank's time before its first action and after its last;
    ``blocking_sends``: each send holds its rank until it arrives (module docstring);
    ``joint(rank, backward, forward)``: where a backward is followed by a forward on its rank,
    the time the two save run as one step (``joint_pairs``; None or 0: one after the other)."""
    done: dict[tuple[str, int, int], float] = {}
    free = {r: (head(r) if head else 0.0) for r in order}
    start_at = dict(free)
    busy = dict.fromkeys(order, 0.0)
    sent = dict.fromkeys(order, 0.0)
    joined = dict.fromkeys(order, 0.0)
    position = dict.fromkeys(order, 0)
    starts: dict[str, float] = {}
    remaining = sum(len(a) for a in order.values())
    while remaining:
        progressed = False
        for rank, actions in order.items():
            while position[rank] < len(actions):
                at = position[rank]
                action = actions[at]
                ready = _ready(action, num_stages, done, transfer)
                if ready is None:
                    break
                together = [action]
                seconds = duration(rank, action)
                if joint is not None and _paired(actions, at) and (saved := joint(rank, action, actions[at + 1])) > 0:
                    forward = actions[at + 1]
                    ready_forward = _ready(forward, num_stages, done, transfer)
                    if ready_forward is None:
                        break
                    ready = max(ready, ready_forward)
                    together.append(forward)
                    seconds += duration(rank, forward) - saved
                    joined[rank] += saved
                start = max(free[rank], ready)
                free[rank] = start + seconds
                busy[rank] += seconds
                for action in together:  # a joint step's outputs leave when it ends
                    done[(action.kind, action.micro, action.stage)] = free[rank]
                    starts[action.label] = start
                    if (to := _receiver(action, num_stages)) is not None:
                        seconds_sent = transfer(action.stage, to)
                        sent[rank] += seconds_sent
                        if blocking_sends:
                            free[rank] += seconds_sent
                position[rank] += len(together)
                remaining -= len(together)
                progressed = True
        if not progressed:
            stuck = {r: a[position[r]].label for r, a in order.items() if position[r] < len(a)}
            raise ValueError(f"the schedule cannot proceed: waiting actions {stuck}")
    ends = {r: free[r] + (tail(r) if tail else 0.0) for r in order}
    span = max(free.values())  # the schedule's flush: every rank's bubble is counted up to it
    held = _held(sent, blocking_sends)
    bubble = {r: span - start_at[r] - busy[r] - held[r] for r in order}
    critical = max(order, key=lambda r: (busy[r] + held[r], ends[r]))
    return PipelineTime(max(ends.values()), busy, bubble, dict(free), critical, starts, sent, blocking_sends, joined)


def extended(low: PipelineTime, high: PipelineTime, micro_low: int, micro_high: int, micro: int) -> PipelineTime:
    """The replay of ``micro`` micro-batches read off the line through replays of ``micro_low``
    and ``micro_high`` (each rank's busy, idle, sent and end times, and the step), where the
    replay grows by the same amount for each micro-batch more: a full pipeline's steady state
    (``search.plan.pipeline.REPLAYED_MICRO_BATCHES`` says where). The busiest rank is the one
    busiest at ``micro``; no action's start is kept."""
    k = (micro - micro_low) / (micro_high - micro_low)

    def line(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
        return {r: a[r] + k * (b[r] - a[r]) for r in a}

    busy, sent, end = line(low.busy_s, high.busy_s), line(low.sent_s, high.sent_s), line(low.end_s, high.end_s)
    held = _held(sent, high.sends_block)
    critical = max(busy, key=lambda r: (busy[r] + held[r], end[r]))
    return PipelineTime(low.step_s + k * (high.step_s - low.step_s), busy, line(low.bubble_s, high.bubble_s), end,
                        critical, {}, sent, high.sends_block, line(low.joint_s, high.joint_s))


def _paired(actions: list[Action], at: int) -> bool:
    """Whether the action at ``at`` is a backward followed on its rank by a forward: the pair
    Megatron-Core's expert overlap runs as one step (the forward of a later micro-batch, which
    needs nothing of the backward)."""
    return at + 1 < len(actions) and actions[at].kind == "B" and actions[at + 1].kind == "F"


def joint_pairs(actions: list[Action]) -> list[Action]:
    """``actions`` in the order their saved activations live where each backward runs beside
    the next forward (``simulate``'s ``joint``): the forward's taken before the backward's
    freed, one micro-batch more in flight (Megatron-Core's extra warm-up forward)."""
    out = list(actions)
    at = 0
    while at < len(out):
        if _paired(out, at):
            out[at], out[at + 1] = out[at + 1], out[at]
            at += 2
        else:
            at += 1
    return out


def _held(sent: dict[int, float], blocking: bool) -> dict[int, float]:
    """Per rank: the time its own sends ``sent`` held it: all of it where sends block, else none."""
    return dict(sent) if blocking else dict.fromkeys(sent, 0.0)


def _receiver(action: Action, num_stages: int) -> int | None:
    """The stage ``action`` sends its output to: a forward's activation to the next stage, a
    backward's (or input gradient's) gradient to the previous one; None where it sends nothing
    (the last stage's forward feeds its own loss, the first stage's backward ends the chain, a
    weight gradient stays on its rank)."""
    if action.kind == "F":
        return action.stage + 1 if action.stage < num_stages - 1 else None
    if action.kind in ("B", "I"):
        return action.stage - 1 if action.stage > 0 else None
    return None


def _ready(action: Action, num_stages: int, done: dict[tuple[str, int, int], float],
           transfer: Callable[[int, int], float]) -> float | None:
    """When ``action``'s input is there; None while it is not produced yet."""
    s, m = action.stage, action.micro
    if action.kind == "F":
        if s == 0:
            return 0.0
        t = done.get(("F", m, s - 1))
        return None if t is None else t + transfer(s - 1, s)
    if action.kind == "W":
        return done.get(("I", m, s))
    if s == num_stages - 1:
        return done.get(("F", m, s))
    t = done.get(("B", m, s + 1), done.get(("I", m, s + 1)))
    return None if t is None else t + transfer(s + 1, s)
