"""How long ``nnperf fit`` takes per model and what-if, before and after interpolated replays.

Run: python benchmarks/fit_speed.py [MODEL ...] [--gpu NAME] [--seq N] [--no-what-ifs]
     [--no-before]

The issue asks for the largest batch "in seconds (search over traces)". A trace of a large
model costs seconds, so the targets are stated in traces, the one cost that does not depend
on the machine, plus the time the replays add:

- at most 4 traces per search (batch 1, the first guess, the answer, the batch after it;
  3 when the guess is the answer or the batch after it; one more where batch 1 runs another
  step than larger batches, so that it cannot be interpolated with them: ViT's class token,
  whose expand is a no-op at batch 1, has another backward);
- allocator replays at most a quarter of the search's time (or half a second);
- the same answer as the search over traces alone, except where that search stopped at a
  boundary below the largest fitting batch (peaks are not monotone in the batch): then the
  new answer is larger and a trace verifies it.

"before" is the search over traces alone (secant and bisection on device totals: what fit
did before interpolation), one search after the other, run here on the same machine with
the same tracer, after "after" (so the fake-tensor cache favours "before"); "after" is
``search.fit`` as it is: the searches in one process per core (``--workers``), so a row's
seconds are that search's own, in its process, and the case's total is the wall time.
Timings on a shared machine move by 20-30% from run to run; the trace counts do not. Default cases: mlp, resnet50 and gpt2 on an A100 40GB and llama-7b
at 2048 tokens on an H200 (the slow one: ~90 s for all what-ifs before).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace

from nnperf.hardware import GPU, load_gpu
from nnperf.request import ModelRequest
from nnperf.search import fit as fit_pass
from nnperf.search.fit import FitResult, Sample
from nnperf.search.memory_variants import MemoryOptions

#: Targets (see the module docstring).
MAX_TRACES = 4
MAX_REPLAY_SHARE = 0.25
MIN_REPLAY_SECONDS = 0.5  # below this the share does not matter (a small model's fast traces)

DEFAULT_CASES = [("mlp", "a100-40gb", None), ("resnet50", "a100-40gb", None),
                 ("gpt2", "a100-40gb", None), ("llama-7b", "h200", 2048)]


@dataclass
class Run:
    """All searches of one case, timed end to end."""

    results: list[FitResult]
    seconds: float


def run_fit(request: ModelRequest, gpu: GPU, what_ifs: bool, interpolate: bool,
            workers: int | None) -> Run:
    """``search.fit.fit``; without ``interpolate`` the samples carry no footprint, so the
    search falls back to secant and bisection over traces (the search before replays)."""
    original = fit_pass.trace_measure

    def reports_only(*args, **kwargs):
        measure = original(*args, **kwargs)
        return lambda batch: Sample(measure(batch).report)

    fit_pass.trace_measure = original if interpolate else reports_only
    try:
        start = time.perf_counter()
        results = fit_pass.fit(request, gpu, MemoryOptions(), include_what_ifs=what_ifs,
                               workers=workers)
        return Run(results, time.perf_counter() - start)
    finally:
        fit_pass.trace_measure = original


def warm_up(request: ModelRequest) -> None:
    """Trace once untimed: the first trace in a process pays for imports and caches."""
    fit_pass.trace_measure(request, MemoryOptions())(1)


def largest(r: FitResult) -> str:
    return "none" if r.largest is None else (">=" if r.capped else "") + str(r.largest)


def print_case(name: str, gpu: GPU, after: Run, before: Run | None) -> list[str]:
    """One row per what-if with the targets beside the figures; returns the missed targets."""
    missed = []
    for i, r in enumerate(after.results):
        b = before.results[i] if before else None
        traces = f"{len(b.probes)} -> {len(r.probes)}" if b else str(len(r.probes))
        secs = f"{b.seconds:6.1f} -> {r.seconds:5.1f}" if b else f"{r.seconds:5.1f}"
        answer = largest(r) if not b or largest(b) == largest(r) else f"{largest(b)} -> {largest(r)}"
        answer += "" if r.exhaustive else "*"
        share = r.replay_seconds / r.seconds if r.seconds else 0.0
        if len(r.probes) > MAX_TRACES + (r.interpolated is not None and 1 not in r.interpolated):
            missed.append(f"{name} / {r.label}: {len(r.probes)} traces")
        if share > MAX_REPLAY_SHARE and r.replay_seconds > MIN_REPLAY_SECONDS:
            missed.append(f"{name} / {r.label}: replays {share:.0%} of the time")
        if b and b.largest is not None and (r.largest or 0) < b.largest:
            missed.append(f"{name} / {r.label}: answer {largest(r)} below {largest(b)}")
        print(f"{name:<12} {r.label:<36} {answer:>12} {traces:>7} {r.replays:>5} "
              f"{share:>6.0%} {secs:>15}")
    total = (f"{before.seconds:6.1f} -> {after.seconds:5.1f}" if before
             else f"{after.seconds:5.1f}")
    speedup = f"  ({before.seconds / after.seconds:.1f}x)" if before else ""
    traces = sum(len(r.probes) for r in after.results)
    traces_text = f"{sum(len(r.probes) for r in before.results)} -> {traces}" if before else str(traces)
    print(f"{name:<12} {'(all searches on ' + gpu.id + ')':<36} {'':>12} {traces_text:>7} "
          f"{'':>5} {'':>6} {total:>15}{speedup}")
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="models (default: the four default cases)")
    parser.add_argument("--gpu", help="GPU for the models given (default a100-40gb)")
    parser.add_argument("--seq", type=int, help="sequence length for the models given")
    parser.add_argument("--no-what-ifs", action="store_true")
    parser.add_argument("--no-before", action="store_true",
                        help="skip the search over traces alone (halves the run time)")
    parser.add_argument("--workers", type=int,
                        help="processes for the searches after (default: one per core)")
    args = parser.parse_args()
    cases = ([(m, args.gpu or "a100-40gb", args.seq) for m in args.models] if args.models
             else [(m, args.gpu or g, args.seq or s) for m, g, s in DEFAULT_CASES])
    print(f"targets: traces <= {MAX_TRACES} per search, replay share <= {MAX_REPLAY_SHARE:.0%} "
          f"(or <= {MIN_REPLAY_SECONDS} s), "
          "largest as before or larger (before -> after)")
    print(f"{'model':<12} {'what-if':<36} {'largest':>12} {'traces':>7} {'repl.':>5} "
          f"{'share':>6} {'seconds':>15}")
    missed: list[str] = []
    for name, gpu_name, seq in cases:
        gpu = load_gpu(gpu_name)
        request = replace(ModelRequest(name), seq_len=seq)
        warm_up(request)
        # after first: what the searches trace twice is then cached for "before", not for it
        after = run_fit(request, gpu, not args.no_what_ifs, True, args.workers)
        before = (None if args.no_before
                  else run_fit(request, gpu, not args.no_what_ifs, False, workers=1))
        missed += print_case(name + (f"@{seq}" if seq else ""), gpu, after, before)
        sys.stdout.flush()
    print("* a verified boundary (it fits, the next batch does not); the batches above it were "
          "not all ruled out (replay budget)")
    print("all targets met" if not missed else "targets missed: " + "; ".join(missed))


if __name__ == "__main__":
    main()
