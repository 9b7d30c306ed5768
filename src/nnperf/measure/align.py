"""Attribute measured time to the trace's ops by aligning the profiler's op sequence with it.

The PyTorch profiler records a tree of ops per thread (``aten::linear`` calling ``aten::t``
and ``aten::addmm``, autograd nodes wrapping backward ops, the optimizer's record_function
wrapping foreach ops). The trace records ops below autograd, at the dispatch level. So the
profiler tree is flattened to the *outermost op whose name the trace also has*; subtrees with
no such name contribute their leaf aten ops as "profiler only" entries. That sequence, in
start-time order, is aligned with the trace's non-free events by name and order: a longest
common subsequence (Myers' O((N+M)D) diff, exact; a greedy matcher such as difflib's matched
516 of 793 ops of a step with 5% random insertions, this matches all), so a few extra or
missing ops on either side shift nothing else. Matched trace events receive the profiled op's
time; unmatched time is reported, never silently spread, and the attributed share says how
much was matched.

On CUDA the time is kernel time (``kernel_times``: each kernel of the profiled step once, to
the op that launched it), and a kernel counts toward that op and every op above: when the
flattening descends into an op the trace does not have, the kernel time that op launched
itself stays as a "profiler only" entry under its name, so no device time is dropped.

The trace records fused attention as ``nnperf.attention`` (and its backward); the profiler
shows the kernel PyTorch picked (flash, memory-efficient, cuDNN, math for CPU). fp32 batch
norm in NCHW runs cuDNN's kernels on a GPU (``aten::cudnn_batch_norm``) where the trace, taken
on the CPU's dispatch path, records ``aten.native_batch_norm``. ``TRACE_NAMES`` maps those
back (the same pairs as ``op_lists.SAME_WORK``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nnperf.measure.kernel_times import KernelTimes


@dataclass(frozen=True)
class ProfiledOp:
    """One op the profiler saw: its name in trace spelling (``aten.addmm``) and its time."""

    name: str
    time_s: float
    start_us: float = 0.0


@dataclass
class Alignment:
    """Trace event index -> measured seconds, plus what could not be matched."""

    by_event: dict[int, float] = field(default_factory=dict)
    matched_s: float = 0.0
    unmatched_s: float = 0.0
    profiler_only: dict[str, float] = field(default_factory=dict)  # op name -> seconds
    trace_only: dict[str, int] = field(default_factory=dict)  # op name -> count
    matched_ops: int = 0
    profiled_ops: int = 0
    trace_ops: int = 0
    kernels: KernelTimes | None = None  # on a GPU: how the kernels were counted

    @property
    def total_s(self) -> float:
        return self.matched_s + self.unmatched_s

    @property
    def attributed_share(self) -> float:
        """Share of the profiled ops' time that landed on a trace op."""
        return self.matched_s / self.total_s if self.total_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "matched_s": self.matched_s,
            "unmatched_s": self.unmatched_s,
            "attributed_share_of_op_time": self.attributed_share,
            "matched_ops": self.matched_ops,
            "profiled_ops": self.profiled_ops,
            "trace_ops": self.trace_ops,
            "profiler_only": dict(sorted(self.profiler_only.items(), key=lambda kv: -kv[1])[:20]),
            "trace_only": dict(sorted(self.trace_only.items(), key=lambda kv: -kv[1])[:20]),
            "kernels": self.kernels.to_json() if self.kernels else None,
        }


#: Profiler op names -> the trace op that stands for them (SDPA and its backends).
TRACE_NAMES: dict[str, str] = {
    **dict.fromkeys(
        ["aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention",
         "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
         "aten._scaled_dot_product_flash_attention_for_cpu", "aten._flash_attention_forward",
         "aten._efficient_attention_forward"],
        "nnperf.attention"),
    **dict.fromkeys(
        ["aten._scaled_dot_product_flash_attention_backward",
         "aten._scaled_dot_product_efficient_attention_backward",
         "aten._scaled_dot_product_cudnn_attention_backward",
         "aten._scaled_dot_product_flash_attention_for_cpu_backward",
         "aten._flash_attention_backward", "aten._efficient_attention_backward"],
        "nnperf.attention_backward"),
    "aten.cudnn_batch_norm": "aten.native_batch_norm",
    "aten.cudnn_batch_norm_backward": "aten.native_batch_norm_backward",
    "aten.miopen_batch_norm": "aten.native_batch_norm",
    "aten.miopen_batch_norm_backward": "aten.native_batch_norm_backward",
    "aten._cudnn_rnn": "nnperf.cudnn_rnn",
    "aten._cudnn_rnn_backward": "nnperf.cudnn_rnn_backward",
}


def profiler_name(name: str) -> str:
    """``aten::addmm`` -> ``aten.addmm`` (the trace's spelling; SDPA kernels -> the trace's
    fused attention op)."""
    dotted = name.replace("::", ".")
    return TRACE_NAMES.get(dotted, dotted)


def flatten_profile(roots: Iterable[Any], known: set[str], *, kernels: KernelTimes | None = None) -> list[ProfiledOp]:
    """Outermost known ops of profiler event trees, in start order.

    ``roots`` are ``FunctionEvent``-like objects (``name``, ``cpu_children``,
    ``cpu_time_total`` in microseconds, ``time_range.start``). ``kernels``: time each op by
    its kernels (a GPU step), else by its host time (a CPU step, where dispatch and math run
    on the same thread).
    """
    out: list[ProfiledOp] = []

    def op_time(ev: Any) -> float:
        return kernels.inclusive_s(ev) if kernels is not None else float(ev.cpu_time_total) * 1e-6

    def start(ev: Any) -> float:
        return float(ev.time_range.start)

    def walk(ev: Any) -> None:
        name = profiler_name(ev.name)
        if name not in known:  # a stand-in the trace does not have: the op's own name
            name = ev.name.replace("::", ".")
        children = sorted(ev.cpu_children, key=start)
        if name in known or (not children and name.startswith("aten.")):
            out.append(ProfiledOp(name, op_time(ev), start(ev)))
            return
        own = kernels.own_s.get(id(ev), 0.0) if kernels is not None else 0.0
        if own > 0.0:  # kernels an op the trace lacks launched itself, outside any child
            out.append(ProfiledOp(name, own, start(ev)))
        for child in children:
            walk(child)

    for root in sorted(roots, key=start):
        walk(root)
    out.sort(key=lambda p: p.start_us)
    return out


#: Where kernels that no op of the step launched are reported among the profiler-only time.
UNLINKED_KERNELS = "(kernels no op of the step launched)"


def align(trace_ops: Sequence[tuple[int, str]], profiled: Sequence[ProfiledOp],
          kernels: KernelTimes | None = None) -> Alignment:
    """Match ``(event index, name)`` trace ops with profiled ops by name and order; on a GPU
    (``kernels``), kernel time no op claimed is unmatched too."""
    a = [name for _, name in trace_ops]
    b = [p.name for p in profiled]
    result = Alignment(profiled_ops=len(profiled), trace_ops=len(trace_ops), kernels=kernels)
    if kernels is not None and kernels.unlinked_s > 0.0:
        result.unmatched_s += kernels.unlinked_s
        result.profiler_only[UNLINKED_KERNELS] = kernels.unlinked_s
    matched_b: set[int] = set()
    matched_a: set[int] = set()
    for ia, ib in common_subsequence(a, b):
        index = trace_ops[ia][0]
        result.by_event[index] = result.by_event.get(index, 0.0) + profiled[ib].time_s
        result.matched_s += profiled[ib].time_s
        matched_a.add(ia)
        matched_b.add(ib)
    result.matched_ops = len(matched_b)
    for ib, p in enumerate(profiled):
        if ib not in matched_b:
            result.unmatched_s += p.time_s
            result.profiler_only[p.name] = result.profiler_only.get(p.name, 0.0) + p.time_s
    for ia, (_, name) in enumerate(trace_ops):
        if ia not in matched_a:
            result.trace_only[name] = result.trace_only.get(name, 0) + 1
    return result


#: Beyond this many edits the exact diff's O(D^2) memory is not worth it: the sequences are
#: not two versions of one step, and difflib's greedy blocks are used instead.
MAX_EDITS = 4000


def common_subsequence(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of ``a`` and ``b``, in order (Myers 1986,
    "An O(ND) difference algorithm": fast when the two differ in few places, as a traced and
    a profiled step do)."""
    n, m = len(a), len(b)
    limit = min(n + m, MAX_EDITS)
    offset = limit + 1
    v = [0] * (2 * limit + 3)
    history: list[list[int]] = []  # v[-d-1 .. d+1] before step d, for the way back
    for d in range(limit + 1):
        history.append(v[offset - d - 1 : offset + d + 2])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]
            else:
                x = v[offset + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _backtrack(history, x, y, d)
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    return [(blk.a + i, blk.b + i) for blk in matcher.get_matching_blocks() for i in range(blk.size)]


def _backtrack(history: list[list[int]], x: int, y: int, d_end: int) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    for d in range(d_end, 0, -1):
        before = history[d]  # v[-d-1 .. d+1] as it was before step d

        def at(k: int, before: list[int] = before, d: int = d) -> int:
            return before[k + d + 1]

        k = x - y
        down = k == -d or (k != d and at(k - 1) < at(k + 1))
        prev_k = k + 1 if down else k - 1
        prev_x = at(prev_k)
        prev_y = prev_x - prev_k
        start_x = prev_x if down else prev_x + 1
        pairs.extend((x - i - 1, y - i - 1) for i in range(x - start_x))
        x, y = prev_x, prev_y
    pairs.extend((i, i) for i in range(x - 1, -1, -1))  # the first snake, from (0, 0)
    pairs.reverse()
    return pairs
