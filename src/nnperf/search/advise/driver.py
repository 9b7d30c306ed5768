"""``nnperf advise``: every change worth checking, each predicted on the same workload.

1. trace and predict the workload as given (``evaluate.base_of``);
2. ask each family of advice (padding, precision, optimizer, CUDA graphs, torch.compile,
   memory format, fused attention, recomputation, GPU) what applies to this model: a change
   that does not apply (channels_last on a transformer) is not offered;
3. predict them: re-timed scenarios here, re-traced ones and the largest-batch searches in
   worker processes (``jobs``; each search also predicts the steps it traced anyway: a
   recomputation at the batch as given and at the largest batch it lets fit, the curve's
   last point), then the rest of the batch curve;
4. rank the code changes by the time saved per sample (what saves under 0.5% is listed as
   checked); the other GPUs are a separate list, fastest first, with their cost per million
   samples: a purchase is not ranked among code changes.

``--apply a,b`` predicts the merge of those items' changes as one scenario.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from nnperf import progress
from nnperf.errors import ResourceError, UsageError
from nnperf.hardware import GPU, DeviceProfile, default_profile, load_gpu
from nnperf.passes.memory.capacity import capacity
from nnperf.passes.timing import TimingOptions
from nnperf.request import LIMITS, InputSpec, ModelRequest
from nnperf.search.advise import (
    attention,
    batch,
    gpus,
    graphs,
    inductor,
    layout,
    optimizer,
    padding,
    precision,
    recompute,
)
from nnperf.search.advise.change import Candidate, Change, Outcome
from nnperf.search.advise.evaluate import Base, Setup, base_of, evaluate
from nnperf.search.advise.jobs import FitJob, FitOutcome, run_parallel
from nnperf.search.advise.result import Advice, AdviceItem
from nnperf.search.fit_parallel import prepare, search_workers
from nnperf.search.gpu_costs import usd_per_million_samples
from nnperf.search.memory_variants import MemoryOptions
from nnperf.trace.options import TraceOptions

FAMILIES = (padding, precision, optimizer, graphs, inductor, layout, attention, recompute, gpus)


def advise(
    model: str | nn.Module,
    gpu: str | GPU = "h100",
    *,
    apply: list[str] | None = None,
    global_batch: int | None = None,
    profile: DeviceProfile | None = None,
    tf32: bool = False,
    cudnn_benchmark: bool = False,
    workers: int | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    inputs: Any = None,
    train: bool = True,
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    dtype: str | None = None,
    amp: str | None = None,
    channels_last: bool = False,
    sdpa: str = "fused",
    **overrides: Any,
) -> Advice:
    """What to change in one step of ``model`` on ``gpu``, each change predicted (the keywords
    are those of ``nnperf.analyze``)."""
    request = ModelRequest(model, batch=batch, seq_len=seq_len, inputs=inputs, input_spec=InputSpec(),
                           overrides=overrides)
    options = MemoryOptions(TraceOptions(train=train, optimizer=optimizer, optimizer_impl=optimizer_impl,
                                         dtype=dtype, amp=amp, channels_last=channels_last, sdpa=sdpa))
    from nnperf.prediction import timing_options

    target = load_gpu(gpu) if isinstance(gpu, str) else gpu
    return advise_request(request, options, target, profile, timing_options(tf32, cudnn_benchmark),
                          apply=apply, global_batch=global_batch, workers=workers)


def advise_request(request: ModelRequest, options: MemoryOptions, gpu: GPU,
                   profile: DeviceProfile | None = None, timing: TimingOptions | None = None, *,
                   apply: list[str] | None = None, global_batch: int | None = None,
                   workers: int | None = None) -> Advice:
    options.trace.validate()
    options.validate()
    if apply is not None:
        check_apply(apply)
    setup = Setup(request, options, gpu, profile or default_profile(gpu), timing or TimingOptions())
    prepare(workers if workers is not None else search_workers(options, 4), backward_first=options.trace.train)
    progress.note("tracing the step as given")
    base, cache = base_of(setup)
    candidates = [c for family in FAMILIES for c in family.candidates(base)]
    advice = Advice(model=base.analysis.model, gpu=gpu.id, config=base.analysis.config, base=base.outcome,
                    items=[], nothing=[], unpredicted=[], checked=base.checked,
                    valid_names=sorted(c.name for c in candidates if c.predicted),
                    prediction=base.prediction, model_label=base.analysis.label,
                    host=setup.profile.host_json(), gpus_not_compared=gpus.not_compared(base))
    if apply:
        advice.combination = _combination(setup, base, cache, candidates, apply)
        return advice
    outcomes: dict[str, Outcome | str] = {}
    progress.note("re-timing the step for changes that keep its trace")
    for c in candidates:  # re-timed here, in milliseconds each
        if c.predicted and not c.change.retraces:
            outcomes[c.name] = evaluate(setup, c.change, base.analysis, cache)
    batches = batch.applies(base)
    kinds = [c.change.recompute for c in candidates if c.family == "recompute"]
    # the largest-batch searches first: each is several traces, so the short re-traces fill in
    # around them instead of one search running alone at the end. Each search also predicts
    # the steps it traces anyway (``jobs``): a recomputation item at the batch as given.
    jobs: list[tuple[str, Change | FitJob]] = []
    searched: dict[str, str] = {}  # candidate name -> its search's label
    given = base.outcome.samples
    if batches:
        for c in candidates:
            if c.family == "recompute":
                searched[c.name] = f"fit:{c.change.recompute}"
                jobs.append((searched[c.name], FitJob(c.change, given, price_given=True)))
        jobs.append(("fit:given", FitJob(Change(), given, seed=base.seed, curve=True, base=base.analysis)))
    jobs += [(c.name, c.change) for c in candidates
             if c.predicted and c.change.retraces and c.name not in searched]
    results = run_parallel(setup, jobs, workers)
    outcomes.update({k: v for k, v in results.items() if not k.startswith("fit:")})
    outcomes.update({name: results[label].at_given for name, label in searched.items()})
    if batches:
        _batch_items(setup, base, advice, results, kinds, candidates, outcomes, global_batch, workers)
    for c in candidates:
        _place(advice, AdviceItem(c, base.outcome, *_outcome(outcomes.get(c.name), c)))
    _gpu_costs(advice, base)
    advice.items.sort(key=lambda i: -(i.gain_s or 0.0))
    advice.nothing.sort(key=lambda i: -(i.gain_s or 0.0))
    advice.gpus.sort(key=lambda i: -(i.gain_s if i.gain_s is not None else float("-inf")))
    return advice


def _outcome(result: Outcome | str | None, c: Candidate) -> tuple[Outcome | None, str]:
    if isinstance(result, Outcome):
        return result, ""
    if isinstance(result, str):
        return None, result
    return None, "" if not c.predicted else "not evaluated"


def _place(advice: Advice, item: AdviceItem) -> None:
    if item.candidate.family == "gpu":
        advice.gpus.append(item)
    elif item.after is None:
        advice.unpredicted.append(item)
    elif item.ranked:
        advice.items.append(item)
    else:
        advice.nothing.append(item)


def _batch_items(setup: Setup, base: Base, advice: Advice, results: dict[str, Any], kinds: list[str | None],
                 candidates: list[Candidate], outcomes: dict[str, Outcome | str], global_batch: int | None,
                 workers: int | None) -> None:
    """The curve up to the largest batch, each recomputation at the largest batch it lets
    fit, the knee, the batch items and gradient accumulation."""
    found: FitOutcome = results["fit:given"]
    largest = found.largest
    given = base.outcome.samples
    points = batch.curve_batches(largest, given) if isinstance(largest, int) else []
    # the search priced its answer and the points its traces determine already
    priced: dict[int, Any] = {**found.curve, **({largest: found.at_largest} if found.at_largest else {})}
    traced = run_parallel(setup, [(f"batch:{b}", Change(batch=b)) for b in points if b not in priced], workers)
    curve = {b: o for b in points for o in [priced.get(b, traced.get(f"batch:{b}"))] if isinstance(o, Outcome)}
    for kind in kinds:
        searched: FitOutcome = results[f"fit:{kind}"]
        match = next(c for c in candidates if c.change.recompute == kind)
        match.extra["largest_batch"] = searched.largest if isinstance(searched.largest, int) else None
        if searched.at_largest is not None:
            match.extra["at_largest_batch"] = searched.at_largest.to_json()
    if not isinstance(largest, int):
        return
    advice.largest_batch = largest
    if not curve:
        return
    curve[given] = base.outcome
    advice.curve = curve
    advice.knee = batch.knee(curve)
    for c in batch.candidates(base, curve, int(largest)):
        candidates.append(c)
        outcomes[c.name] = curve[c.change.batch or given]
    if global_batch:
        advice.accumulation = _accumulation(setup, curve, global_batch, int(largest), workers)


def _accumulation(setup: Setup, curve: dict[int, Outcome], global_batch: int, largest: int,
                  workers: int | None) -> batch.Accumulation | None:
    """``global_batch`` reached exactly on one GPU: the fastest micro-batch among those that
    divide it and fit, of the curve's points and the largest such (traced here unless the
    curve has it). None where none of them could be predicted."""
    micros = batch.accumulation_micro_batches(global_batch, largest)
    options = {b: curve[b] for b in micros if b in curve}
    if micros[-1] not in options:
        found = run_parallel(setup, [("micro", Change(batch=micros[-1]))], workers).get("micro")
        if isinstance(found, Outcome):
            options[micros[-1]] = found
    if not options:
        return None
    micro = max(options, key=lambda b: options[b].throughput)
    return batch.accumulation(global_batch, micro, options[micro])


def batch_item(name: str) -> int | None:
    """N of an ``--apply`` item ``batch-N`` (checked: a batch the CLI takes), None for another name."""
    if not name.startswith("batch-"):
        return None
    text = name[len("batch-"):]
    if not text.isdigit():
        raise UsageError(f"--apply {name!r}: expected batch-N with N {LIMITS['batch'].describe()}")
    return LIMITS["batch"].check(int(text), f"--apply {name}: batch")


def check_apply(names: list[str]) -> list[str]:
    """``--apply``'s names as the user gave them, checked before any trace: each once, at most
    one ``batch-N`` (names that the trace decides are checked against it later)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise UsageError(f"--apply names {name!r} twice; give each item once")
        seen.add(name)
    batches = [n for n in names if batch_item(n) is not None]
    if len(batches) > 1:
        raise UsageError(f"--apply names two batch sizes ({', '.join(batches)}); give one")
    return names


def _combination(setup: Setup, base: Base, cache: dict[str, Any], candidates: list[Candidate],
                 names: list[str]) -> AdviceItem:
    by_name = {c.name: c for c in candidates if c.predicted}
    chosen = []
    for name in names:
        if name in by_name:
            chosen.append(by_name[name])
        elif batch_item(name) is not None:
            b = batch_item(name)
            chosen.append(Candidate(name=name, family="batch", title=f"batch size {b}", change=Change(batch=b),
                                    how=f"--batch {b}"))
        else:
            raise UsageError(f"unknown advice item {name!r}; valid: {', '.join(sorted(by_name))}, batch-N")
    change = functools.reduce(lambda a, b: a.merge(b), (c.change for c in chosen), Change())
    after = evaluate(setup, change, None if change.retraces else base.analysis, cache)
    if change.batch is not None and after.fits is False and after.peak_bytes is not None:
        # a batch-N item asks for that batch: a step that cannot run is no answer to give
        raise ResourceError(f"--apply {'+'.join(names)}: batch {change.batch} does not fit on the "
                            f"{setup.gpu.name} ({after.peak_bytes / 2**30:.1f} GiB > "
                            f"{capacity(setup.gpu) / 2**30:.1f} GiB); 'nnperf fit' finds the largest that does")
    combined = Candidate(
        name="+".join(c.name for c in chosen), family="combination",
        title=" + ".join(c.title for c in chosen), change=change, how="\n".join(c.how for c in chosen),
        layers=sorted({layer for c in chosen for layer in c.layers}),
        assumptions=[a for c in chosen for a in c.assumptions],
    )
    return AdviceItem(combined, base.outcome, after)


def _gpu_costs(advice: Advice, base: Base) -> None:
    """USD per million samples on each GPU (``compare``'s rule), beside the given GPU's."""
    mine = usd_per_million_samples(base.gpu.price_usd_per_hour, base.outcome.samples / base.outcome.step_s,
                                   bool(base.outcome.fits))
    for item in advice.gpus:
        c = item.candidate
        if item.after is None:
            continue
        cost = usd_per_million_samples(c.extra.get("usd_per_hour"), item.after.samples / item.after.step_s,
                                       bool(item.after.fits))
        c.extra["usd_per_million_samples"] = cost
        c.extra["given_gpu_usd_per_million_samples"] = mine
        if cost is not None:
            c.title += f": {cost:.3g} USD per million samples" + (f" (now {mine:.3g})" if mine else "")
