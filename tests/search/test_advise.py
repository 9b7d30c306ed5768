"""nnperf.advise: each item's prediction checked against a relation computed independently
(the GEMM model called directly, the plain predict of the changed workload, the timeline's
own terms), never against a frozen number."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import Analysis
from nnperf.errors import ResourceError
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.gemm import estimate_gemm
from nnperf.passes.timing import TimingOptions, simulate_step
from nnperf.prediction import predict_analysis
from nnperf.request import ModelRequest
from nnperf.search.advise import Change, advise, inductor, padding
from nnperf.search.advise import attention as sdpa
from nnperf.search.advise.evaluate import Setup, base_of, evaluate, trace_change
from nnperf.search.advise.rewrite import Rewritten
from nnperf.search.memory_variants import MemoryOptions
from nnperf.trace.options import TraceOptions

A100 = load_gpu("a100-40gb-sxm")
TINY_GPT = dict(n_layer=1, n_embd=64, n_head=2)


def _setup(model, gpu=A100, batch=2, seq=None, **trace) -> Setup:  # type: ignore[no-untyped-def]
    overrides = TINY_GPT if model == "gpt2" else {}
    req = ModelRequest(model, batch=batch, seq_len=seq, overrides=overrides)
    return Setup(req, MemoryOptions(TraceOptions(**trace)), gpu, default_profile(gpu), TimingOptions())


def test_padded_vocabulary_gemms_are_retimed_by_the_gemm_model():
    setup = _setup("gpt2", seq=128, amp="bf16")
    base, _ = base_of(setup)
    fams = padding.families(base)
    assert fams["vocabulary"] == {50257: 50304}  # 64 bf16 elements = 128 bytes on Ampere
    analysis = base.analysis
    rw = Rewritten(analysis.trace, list(analysis.ops))
    padding.rewrite(analysis, setup.options, rw, {50257: 50304})
    step = simulate_step(rw.trace, rw.counts, A100, setup.profile, setup.timing)
    checked = 0
    for t in step.ops:
        for gt in t.gemms:
            g = gt.gemm
            if 50304 in (g.m, g.n, g.k):
                direct = estimate_gemm(g.m, g.n, g.k, batch=g.batch, dtype=g.dtype, gpu=A100, profile=setup.profile)
                assert gt.estimate.time_s == pytest.approx(direct.time_s)
                assert direct.aligned
                checked += 1
            assert 50257 not in (g.m, g.n, g.k)
    assert checked == 3  # lm_head forward, grad_input, grad_weight
    # padded FLOPs: 2 * tokens * 47 * 64 per GEMM, three GEMMs
    before = sum(g.flops for g in analysis.gemms)
    after = sum(gt.gemm.flops for t in step.ops for gt in t.gemms)
    assert after - before == 3 * 2 * (2 * 128) * 47 * 64


def test_optimizer_and_precision_items_equal_a_plain_prediction_of_the_changed_step():
    setup = _setup("gpt2", seq=64)
    _base, _cache = base_of(setup)
    for change, kwargs in ((Change(trace=(("optimizer_impl", "fused"),)), {"optimizer_impl": "fused"}),
                           (Change(trace=(("amp", "bf16"),)), {"amp": "bf16"})):
        out = evaluate(setup, change)
        import nnperf.analysis as A

        a = A.analyze("gpt2", batch=2, seq_len=64, **TINY_GPT, **kwargs)
        p = predict_analysis(a, A100)
        assert out.step_s == pytest.approx(p.totals["step_time_s"], rel=1e-9)
        assert out.peak_bytes == pytest.approx(p.memory.device_total)


def test_a_step_traced_unfused_is_offered_sdpas_fused_kernel_re_traced():
    """Under ``--sdpa unfused`` the model already calls SDPA: the attention item is its fused
    kernel, a plain prediction of the step traced fused, not a rewrite of hand attention."""
    setup = _setup("gpt2", seq=64, sdpa="unfused")
    base, _cache = base_of(setup)
    [item] = sdpa.candidates(base)
    assert item.change.trace_changes() == {"sdpa": "fused"} and not item.change.sdpa
    out = evaluate(setup, item.change)
    import nnperf.analysis as A

    p = predict_analysis(A.analyze("gpt2", batch=2, seq_len=64, **TINY_GPT), A100)
    assert out.step_s == pytest.approx(p.totals["step_time_s"], rel=1e-9)
    assert out.peak_bytes == pytest.approx(p.memory.device_total)


def test_the_compiled_loss_item_is_a_plain_prediction_of_the_step_with_its_loss_compiled():
    setup = _setup("gpt2", seq=64)
    base, _cache = base_of(setup)
    [item] = [c for c in inductor.candidates(base) if c.name == "compile-loss"]
    assert item.change.trace_changes() == {"loss": "compiled"}
    out = evaluate(setup, item.change)
    import nnperf.analysis as A

    p = predict_analysis(A.analyze("gpt2", batch=2, seq_len=64, loss="compiled", **TINY_GPT), A100)
    assert out.step_s == pytest.approx(p.totals["step_time_s"], rel=1e-9)
    assert out.peak_bytes == pytest.approx(p.memory.device_total)
    # already compiled, or no cross entropy in the loss (mnist's NLL): nothing to offer
    compiled, _ = base_of(_setup("gpt2", seq=64, loss="compiled"))
    assert not [c for c in inductor.candidates(compiled) if c.name == "compile-loss"]
    nll, _ = base_of(_setup("mnist-cnn"))
    assert not [c for c in inductor.candidates(nll) if c.name == "compile-loss"]


def test_the_flex_attention_item_is_a_plain_prediction_of_the_decoder_attending_with_flex():
    """A built-in decoder on SDPA: the item is the step re-traced with ``-O attention=flex``
    (its prediction and memory equal a plain one of that model); a decoder already on
    FlexAttention, or a model without the option, gets none."""
    import nnperf.analysis as A

    tiny = dict(n_layer=1, dim=64, n_heads=4, ffn_hidden=96, vocab=64)
    h100 = load_gpu("h100")

    def setup(**extra):  # type: ignore[no-untyped-def]
        req = ModelRequest("llama-7b", batch=2, seq_len=256, overrides={**tiny, **extra})
        return Setup(req, MemoryOptions(TraceOptions(amp="bf16")), h100, default_profile(h100), TimingOptions())

    plain = setup()
    base, _cache = base_of(plain)
    [item] = [c for c in sdpa.candidates(base) if c.name == "flex-attention"]
    assert item.change.model == (("attention", "flex"),) and item.change.retraces
    out = evaluate(plain, item.change)
    p = predict_analysis(A.analyze("llama-7b", batch=2, seq_len=256, amp="bf16", attention="flex", **tiny), h100)
    assert out.step_s == pytest.approx(p.totals["step_time_s"], rel=1e-9)
    assert out.peak_bytes == pytest.approx(p.memory.device_total)
    flex, _ = base_of(setup(attention="flex"))
    assert not [c for c in sdpa.candidates(flex) if c.name == "flex-attention"]
    gpt, _ = base_of(_setup("gpt2", seq=64))
    assert not [c for c in sdpa.candidates(gpt) if c.name == "flex-attention"]


def test_tf32_item_is_the_same_trace_with_tf32_matmuls():
    setup = _setup("gpt2", seq=64)
    base, cache = base_of(setup)
    out = evaluate(setup, Change(tf32=True), base.analysis, cache)
    p = predict_analysis(base.analysis, A100, timing=TimingOptions(tf32_matmul=True))
    assert out.step_s == pytest.approx(p.totals["step_time_s"])
    assert out.device_busy_s < base.outcome.device_busy_s  # its GEMMs run faster (the step may be host-bound)


def test_cuda_graphs_gain_is_the_host_time_not_hidden_minus_one_launch():
    setup = _setup("mlp", batch=1)
    base, cache = base_of(setup)
    step = base.prediction.step
    assert step.bound == "host"
    out = evaluate(setup, Change(graphs=True), base.analysis, cache)
    assert out.step_s == pytest.approx(step.device_busy_s + setup.profile.host_dispatch_s)
    assert out.step_s < step.step_s


def test_fusion_reads_inputs_once_and_launches_fewer_kernels():
    setup = _setup("gpt2", seq=64, amp="bf16")
    base, _ = base_of(setup)
    chains = inductor.fusion_chains(base.analysis.trace, base.analysis.ops)
    assert chains and all(len(c) >= 2 for c in chains)
    rw = Rewritten(base.analysis.trace, list(base.analysis.ops))
    inductor.rewrite(rw)
    fused = [c for c in rw.counts if c.op == "inductor.fused"]
    assert len(fused) == len(chains)
    for chain, f in zip(chains, fused, strict=False):
        assert f.bytes <= sum(c.bytes for c in chain)  # intermediates never reach memory
        assert f.flops == sum(c.flops for c in chain)
    kernels = lambda counts: sum(1 for c in counts if c.category not in ("alloc", "host"))  # noqa: E731
    assert kernels(rw.counts) == kernels(base.analysis.ops) - sum(len(c) - 1 for c in chains)


def test_a_step_already_fused_is_not_offered_torch_compile():
    """--pointwise fused already times the blocks' pointwise ops as inductor's kernels: offering
    torch.compile on top would count the same fusion twice."""
    def setup(pointwise: str) -> Setup:
        request = ModelRequest("gpt2", batch=2, seq_len=64, overrides={**TINY_GPT, "n_layer": 2})
        return Setup(request, MemoryOptions(TraceOptions(amp="bf16", pointwise=pointwise)), A100,
                     default_profile(A100), TimingOptions())

    eager, _ = base_of(setup("eager"))
    assert inductor.candidates(eager)[-1].name == "torch-compile"
    fused, _ = base_of(setup("fused"))
    assert "torch-compile" not in [c.name for c in inductor.candidates(fused)]
    assert ("torch-compile", "the step's pointwise ops already run fused (--pointwise fused)") in fused.checked


class HandAttention(nn.Module):
    """Attention written by hand: scores, causal mask, softmax, weighted sum."""

    def __init__(self, dim=64, heads=4):  # type: ignore[no-untyped-def]
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):  # type: ignore[no-untyped-def]
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.qkv(x).chunk(3, -1))
        s = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class TwoBlocks(nn.Module):
    def __init__(self):  # type: ignore[no-untyped-def]
        super().__init__()
        self.blocks = nn.Sequential(HandAttention(), HandAttention())

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.blocks(x)


def test_hand_attention_is_found_and_replaced_by_fused_attention():
    req = ModelRequest(TwoBlocks(), inputs=(torch.randn(2, 128, 64),))
    setup = Setup(req, MemoryOptions(TraceOptions(amp="bf16")), A100, default_profile(A100), TimingOptions())
    analysis: Analysis = trace_change(setup, Change())
    found = sdpa.find(analysis.ops)
    assert sorted(h.module for h in found) == ["blocks.0", "blocks.1"]
    assert found[0].scores == (2, 4, 128, 128) and found[0].causal
    rw = Rewritten(analysis.trace, list(analysis.ops))
    sdpa.rewrite(rw)
    names = [c.op for c in rw.counts]
    assert names.count("nnperf.attention") == 2 and names.count("nnperf.attention_backward") == 2
    assert not any(m.shape[-2:] == (128, 128) and m.numel == 2 * 4 * 128 * 128
                   for c in rw.counts for m in c.event.outputs)
    assert rw.memory_delta < 0  # score-sized tensors no longer saved for backward


def test_channels_last_is_offered_for_cnns_only_and_is_a_plain_prediction_of_the_nhwc_step():
    cnn = advise("resnet18", A100, batch=2, amp="bf16", workers=1, train=False)
    item = next(i for i in cnn.items + cnn.nothing if i.name == "channels-last")
    import nnperf.analysis as A

    nhwc = predict_analysis(A.analyze("resnet18", batch=2, amp="bf16", train=False, channels_last=True), A100)
    assert item.after.step_s == pytest.approx(nhwc.totals["step_time_s"], rel=1e-9)
    assert item.after.peak_bytes == pytest.approx(nhwc.memory.device_total)
    # bf16 convolutions run on tensor cores: NHWC drops cuDNN's layout transposes
    assert item.after.step_s < item.before.step_s and item.after.kernels < item.before.kernels
    assert "sdpa" not in {i.name for i in cnn.items + cnn.nothing}
    done = advise("resnet18", A100, batch=2, amp="bf16", workers=1, train=False, channels_last=True,
                  apply=["gpu-h100-sxm"])
    assert "channels-last" not in done.valid_names and "channels-last" in dict(done.checked)
    gpt = advise("gpt2", A100, batch=1, seq_len=32, train=False, workers=1, **TINY_GPT)
    assert "channels-last" not in {i.name for i in gpt.items + gpt.nothing + gpt.unpredicted}


def test_other_gpus_are_listed_apart_from_the_code_changes():
    adv = advise("mlp", A100, batch=8, workers=1, train=False)
    assert adv.gpus and all(i.candidate.family == "gpu" for i in adv.gpus)
    assert not any(i.candidate.family == "gpu" for i in adv.items + adv.nothing + adv.unpredicted)
    gains = [i.gain_s for i in adv.gpus]
    assert gains == sorted(gains, reverse=True)  # fastest first
    from nnperf.search.gpu_costs import usd_per_million_samples

    for i in adv.gpus:  # compare's rule, recomputed from the item's own outcome and the catalog
        price = load_gpu(i.name.removeprefix("gpu-")).price_usd_per_hour
        want = usd_per_million_samples(price, i.after.samples / i.after.step_s, bool(i.after.fits))
        assert i.candidate.extra["usd_per_million_samples"] == want
    doc = adv.to_json()
    assert [g["name"] for g in doc["gpus"]] == [i.name for i in adv.gpus]
    assert not any(g["family"] == "gpu" for g in doc["items"] + doc["gains_nothing"])


def test_apply_predicts_the_merged_change_and_rejects_unknown_names():
    from nnperf.errors import UsageError

    adv = advise("gpt2", A100, batch=2, seq_len=64, apply=["amp-bf16", "optimizer-fused"], workers=1,
                 **TINY_GPT)
    import nnperf.analysis as A

    p = predict_analysis(A.analyze("gpt2", batch=2, seq_len=64, amp="bf16", optimizer_impl="fused", **TINY_GPT),
                         A100)
    assert adv.combination.after.step_s == pytest.approx(p.totals["step_time_s"])
    with pytest.raises(UsageError, match=r"unknown advice item 'nope'; valid: .*amp-bf16"):
        advise("gpt2", A100, batch=2, seq_len=64, apply=["nope"], workers=1, **TINY_GPT)


def test_conflicting_changes_are_refused():
    from nnperf.errors import UsageError

    with pytest.raises(UsageError, match="conflicting"):
        Change(trace=(("amp", "bf16"),)).merge(Change(trace=(("amp", "fp16"),)))


def test_an_item_on_one_fsdp_rank_is_plans_rank_step_with_the_change():
    from nnperf.errors import UsageError
    from nnperf.hardware.cluster import cluster_for_gpu
    from nnperf.layout import Execution
    from nnperf.search import plan
    from nnperf.search.advise.sharded import evaluate_on_layout

    gpu = load_gpu("h100-sxm")
    cluster = cluster_for_gpu(gpu.id)
    req = ModelRequest("gpt2", batch=2, seq_len=64, overrides=TINY_GPT)
    ex = Execution(world=2, data="fsdp", shard=2, micro_batch=2)
    options = TraceOptions(amp="bf16")
    fused = evaluate_on_layout(req, options, Change(trace=(("optimizer_impl", "fused"),)), ex, gpu, cluster)
    direct = plan.evaluate(req, TraceOptions(amp="bf16", optimizer_impl="fused"), ex, gpu, cluster)
    assert fused.step_s == pytest.approx(direct.step_s, rel=1e-9)
    foreach = evaluate_on_layout(req, options, Change(), ex, gpu, cluster)
    assert fused.step_s < foreach.step_s  # one fused kernel per group instead of a dozen foreach ops
    assert fused.state_bytes == foreach.state_bytes  # the same sharded optimizer state
    with pytest.raises(UsageError, match="graphs"):
        evaluate_on_layout(req, options, Change(graphs=True), ex, gpu, cluster)


def test_largest_batches_and_the_steps_there_are_fits_answers_and_plain_predictions():
    # each search starts at the batch as given and prices the traces it shares with items;
    # checked against fit's own search (from batch 1) and a plain re-trace of each step
    from nnperf.search.fit import fit

    gpu = load_gpu("a100-40gb", overrides={"memory_gib": "1"})
    tiny = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab": 512, "n_positions": 64}
    adv = advise("gpt2", gpu, batch=4, seq_len=64, optimizer="sgd", amp="bf16", workers=1, **tiny)
    request = ModelRequest("gpt2", batch=4, seq_len=64, overrides=tiny)
    options = MemoryOptions(TraceOptions(optimizer="sgd", amp="bf16"))
    setup = Setup(request, options, gpu, default_profile(gpu), TimingOptions())

    def largest(checkpoint: bool | str) -> int | None:
        return fit(request, gpu, options.with_(checkpoint=checkpoint), include_what_ifs=False, workers=1)[0].largest

    assert adv.largest_batch == largest(False) and adv.largest_batch > 4
    assert set(adv.curve) >= {4, adv.largest_batch}
    for b, outcome in adv.curve.items():
        assert outcome == evaluate(setup, Change(batch=None if b == 4 else b))
    items = {i.name: i for i in adv.items + adv.nothing}
    for kind, checkpoint in (("full", True), ("selective", "selective")):
        item = items[f"checkpoint-{kind}"]
        assert item.after == evaluate(setup, Change(recompute=kind))
        most = item.candidate.extra["largest_batch"]
        assert most == largest(checkpoint) and most > adv.largest_batch
        assert item.candidate.extra["at_largest_batch"] == evaluate(setup, Change(recompute=kind, batch=most)).to_json()


def test_search_jobs_pickle_for_fork_server_workers_without_the_base_trace():
    # traces do not pickle: a fork-server worker gets the job without it (and traces the batch
    # as given itself), where a forked worker inherits it; the seed (report + footprint) travels
    import pickle

    from nnperf.search.advise.jobs import FitJob, run_fit

    gpu = load_gpu("a100-40gb", overrides={"memory_gib": "1"})
    setup = Setup(ModelRequest("gpt2", batch=4, seq_len=32, overrides=TINY_GPT),
                  MemoryOptions(TraceOptions(optimizer="sgd", amp="bf16")), gpu, default_profile(gpu), TimingOptions())
    base, _ = base_of(setup)
    job = FitJob(Change(), base.outcome.samples, seed=base.seed, curve=True, base=base.analysis)
    back = pickle.loads(pickle.dumps((setup, job)))[1]
    assert back.base is None and job.base is base.analysis
    assert (back.change, back.given, back.curve) == (job.change, job.given, job.curve)
    assert back.seed.report == base.seed.report
    here, there = run_fit(setup, job), run_fit(setup, back)
    assert len(here.curve) >= 2 and here == there  # the worker traced the batch as given itself
    assert back.seed.footprint.matches(base.seed.footprint)


def test_accumulation_takes_out_the_optimizers_wall_time_once_per_extra_micro_batch():
    """A tiny GPT-2 step is host-bound: each further micro-batch adds the host's dispatch of
    its forward and backward, not the optimizer's (longer than its kernels), which an
    accumulated step runs once. Worked out from the ops of a plain prediction of the step."""
    from nnperf.search.advise.batch import accumulation

    setup = _setup("gpt2", seq=64)
    base_of(setup)  # the base trace first, as advise runs it
    out = evaluate(setup, Change())
    import nnperf.analysis as A

    step = predict_analysis(A.analyze("gpt2", batch=2, seq_len=64, **TINY_GPT), A100).step
    assert step.bound == "host"
    optimizer_host = sum(t.host_s for t in step.ops if t.phase == "optimizer")
    assert optimizer_host > sum(t.kernel_s for t in step.ops if t.phase == "optimizer")
    # each further micro-batch adds the host's dispatch of its forward and backward
    four = accumulation(8, 2, out)
    assert four.split.steps == 4 and four.split.global_batch == 8
    assert four.time_s == pytest.approx(out.step_s + 3 * (step.host_s - optimizer_host), rel=1e-9)


@pytest.mark.parametrize(("global_batch", "micro"), [(7, 7), (1000, None)])
def test_global_batch_accumulation_adds_up_to_the_batch_asked_for(global_batch, micro):
    """``--global-batch 7`` printed "2 x micro-batch 4" (8 samples) though a micro-batch of 7
    fits, and 1000 became 15 x 70 = 1050: the split is now exact, its micro-batch a divisor
    that fits (plan's rule, ``search.accumulation.BatchSplit``)."""
    found = advise("mlp", "h100", global_batch=global_batch, widths="256,256")
    split = found.accumulation.split
    assert split.micro_batch * split.steps == global_batch
    assert global_batch % split.micro_batch == 0 and split.micro_batch <= found.largest_batch
    assert found.to_json()["accumulation"]["samples"] == global_batch
    if micro is not None:
        assert (split.micro_batch, split.steps) == (micro, 1)


def test_an_applied_item_that_does_not_fit_is_never_ranked_as_a_gain():
    """``--apply batch-99999999`` ranked first with "+20.7%" though it needs 89,790 TiB: a batch
    asked for that cannot fit is refused in one line with its memory (#38), never ranked."""
    with pytest.raises(ResourceError, match=r"--apply batch-99999999: batch 99999999 does not fit on the H100 "
                                            r"SXM5 80GB \([\d.]+ GiB > [\d.]+ GiB\)"):
        advise("mlp", "h100", apply=["batch-99999999"], widths="256,256")


def test_pad_channels_says_the_channels_whose_kernels_give_the_padded_dimension():
    """ResNet's stem convolution: K = 3 channels x 7 x 7 = 147. Its padding was shown as
    147 -> 192 with "pad the input to 4 channels" (4 x 49 = 196): now the channel count whose
    K is a multiple of 16 bytes (8 bf16 elements), and that K."""
    setup = Setup(ModelRequest("resnet18", batch=2, overrides={"image_size": 64}),
                  MemoryOptions(TraceOptions(amp="bf16")), A100, default_profile(A100), TimingOptions())
    base, _ = base_of(setup)
    channels = 8  # the fewest channels c >= 3 with c x 49 a multiple of 8: 49 is odd, so c = 8
    assert channels * 49 % 8 == 0 and all(c * 49 % 8 for c in range(3, channels))
    assert padding.families(base)["channels"] == {147: channels * 49}
    item = next(c for c in padding.candidates(base) if c.name == "pad-channels")
    assert item.change.pad == ((147, 392),)
    assert "input channels 3 -> 8 (K = channels x 7 x 7 kernel: 147 -> 392)" in item.how
