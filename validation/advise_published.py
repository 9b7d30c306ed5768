"""nnperf advise against published gains (issue 17): each published figure reproduced with the
advice item it is about, on the published setup, with its source and a stated tolerance.
Misses are reported, never tuned away; ``tests/search/test_advise_published.py`` recomputes
every reproduction and asserts its tolerance (a known miss is a strict xfail, so fixing the
model shows up there).

Tolerance (one rule for all): the predicted gain (speedup - 1) lies within +-50% of the
published gain; where the source gives a range, within the range widened by 50% at each end.
Where the source also gives absolute times they are printed beside the predicted ones with a
+-25% band (about the p90 error of nnperf's faithful published-measurement rows, README);
they are not what the item claims, so only the CUDA-graphs case, whose gain misses, is held
to one (the graphed step's time). Predictions use the catalog GPU and the default profile,
nothing fitted to these figures.

Run: python validation/advise_published.py   (about a minute on 2 cores)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nnperf.hardware import load_gpu
from nnperf.hardware.cluster import cluster_for_gpu
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.advise import Change, advise
from nnperf.search.advise.sharded import evaluate_on_layout
from nnperf.trace.options import TraceOptions

TOLERANCE = 0.5  # of the published gain
TIME_TOLERANCE = 0.25  # of a published absolute time
HERE = Path(__file__).resolve().parent
MEGATRON_SLICE = f"{HERE / 'megatron_slice.py'}:build"


@dataclass
class Reproduction:
    """One published gain against the advice item's prediction of it."""

    name: str
    item: str  # the advice item (or items) that predict it
    source: str
    setup: str
    published: tuple[float, float]  # published speedup (low, high; equal for one figure)
    predicted: float  # predicted speedup
    times: list[tuple[str, float, float]] = field(default_factory=list)  # (what, predicted s, published s)
    details: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def band(self) -> tuple[float, float]:
        """The predicted speedups within tolerance."""
        low, high = self.published
        return 1 + (low - 1) * (1 - TOLERANCE), 1 + (high - 1) * (1 + TOLERANCE)

    @property
    def within(self) -> bool:
        low, high = self.band
        return low <= self.predicted <= high

    def time_within(self, what: str) -> bool:
        predicted, published = next((p, q) for w, p, q in self.times if w == what)
        return abs(predicted / published - 1) <= TIME_TOLERANCE

    def lines(self) -> list[str]:
        low, high = self.published
        pub = f"{low - 1:+.1%}" if low == high else f"{low - 1:+.1%}..{high - 1:+.1%}"
        out = [f"{self.name}: predicted {self.predicted - 1:+.1%}, published {pub} "
               f"[{'within' if self.within else 'MISS'} +-{TOLERANCE:.0%} of the gain]"]
        for what, predicted, published in self.times:
            verdict = "within" if self.time_within(what) else "outside"
            out.append(f"    {what}: predicted {_s(predicted)}, published {_s(published)} "
                       f"({predicted / published - 1:+.0%}, {verdict} +-{TIME_TOLERANCE:.0%})")
        return out


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def nanogpt_vocab() -> Reproduction:
    """Karpathy's nanoGPT pads GPT-2's vocabulary 50257 -> 50304."""
    adv = advise("gpt2", "a100-40gb-sxm", batch=12, seq_len=1024, amp="bf16", apply=["pad-vocabulary"])
    item = adv.combination
    return Reproduction(
        "nanoGPT vocabulary 50257 -> 50304", "pad-vocabulary",
        "nanoGPT model.py: 'vocab_size: int = 50304 # GPT-2 vocab_size of 50257, padded up to nearest "
        "multiple of 64 for efficiency'; Karpathy, x.com/karpathy/status/1621578354024677377: ~25% faster",
        "GPT-2 124M, eager, bf16 autocast, batch 12 x 1024 tokens, AdamW, A100 40GB SXM",
        (1.25, 1.25), item.speedup,
        details=[f"step {item.before.step_s * 1e3:.0f} -> {item.after.step_s * 1e3:.0f} ms"],
        assumptions=["the tweet's 'about 25%' is read as 1.25x; its exact setup (batch, GPU) is nanoGPT's "
                     "train_gpt2 defaults"],
    )


def channels_last_resnet50() -> Reproduction:
    """PyTorch's memory-format tutorial: ResNet-50, apex AMP O2, 0.258 -> 0.198 s/iter."""
    adv = advise("resnet50", "v100-sxm2", batch=200, amp="fp16", optimizer="sgd-momentum",
                 apply=["channels-last"])
    item = adv.combination
    mib = 2**20
    return Reproduction(
        "channels_last ResNet-50 AMP", "channels-last",
        "pytorch/tutorials intermediate_source/memory_format_tutorial.py ('Performance Gains'): "
        "'python main_amp.py -a resnet50 --b 200 --workers 16 --opt-level O2 ./data', CUDNN VERSION 7603, "
        "steady 'Time 0.258' s/iter; with '--channels-last true' 'Time 0.198'; GPU: a Volta card (apex PR "
        "#668, the same benchmark: 'Requirements: Volta GPU, CudNN >= 7.603 ... steady 22% performance gains')",
        "ResNet-50 training, batch 200, 224x224, fp16 (apex O2), SGD momentum, Tesla V100 SXM2",
        (0.258 / 0.198, 0.258 / 0.198), item.speedup,
        times=[("NCHW step", item.before.step_s, 0.258), ("channels_last step", item.after.step_s, 0.198)],
        details=[f"peak memory {item.before.peak_bytes / mib:.0f} -> {item.after.peak_bytes / mib:.0f} MiB"],
        assumptions=["apex O2 (fp16 model, fp32 batch norm and master weights) is traced as torch.autocast "
                     "fp16 with a GradScaler: both run convolutions and activations in fp16",
                     "the V100 variant is not named: SXM2 (the PCIe card differs by its clock)",
                     "the tutorial's time includes a 16-worker DataLoader; taken as hidden behind the GPU"],
    )


def cuda_graphs_gpt_fast() -> Reproduction:
    """PyTorch's gpt-fast blog: Llama-2-7B decoding at batch 1, eager 25.5 -> 107.0 tokens/s with
    torch.compile(mode="reduce-overhead"), i.e. CUDA graphs plus inductor's kernels.

    Why this figure: the figures of "Accelerating PyTorch with CUDA Graphs" (pytorch.org blog,
    2021) are MLPerf runs on 272 / 4096 GPUs (Mask R-CNN 1.70x, BERT 1.12x) of models the zoo
    lacks, and its one per-GPU figure (Mask R-CNN's graphed backbone, 31 -> 6 ms at batch 1)
    names neither the image size nor the graphed scope beyond "mostly just the resnet
    backbone"; the C++ MNIST tutorial's 44 s -> 7 s times whole epochs of the C++ frontend,
    whose dispatch is not Python's. gpt-fast's setup is complete (model, precision, batch, GPU)."""
    kwargs = dict(batch=1, seq_len=1, dtype="bf16", train=False, workers=1)
    graphs = advise("llama-7b", "a100-80gb-sxm", apply=["cuda-graphs"], **kwargs).combination
    both = advise("llama-7b", "a100-80gb-sxm", apply=["cuda-graphs", "torch-compile"], **kwargs).combination
    ms = 1e3
    return Reproduction(
        "CUDA graphs (+ compile) on host-bound Llama-2-7B decoding", "cuda-graphs + torch-compile",
        "pytorch.org/blog/accelerating-generative-ai-2 (gpt-fast, 2023-11-30): 'Starting Point (25.5 tok/s)' "
        "... 'heavily CPU overhead bound'; 'Step 1: Reducing CPU overhead through torch.compile and a static "
        "kv-cache (107.0 tok/s)', torch.compile(decode_one_token, mode=\"reduce-overhead\", fullgraph=True); "
        "'latency (i.e. batch size=1) ... A100-80GB, power limited to 330W'",
        "Llama-2-7B (= the zoo's llama-7b shapes) bf16 weights, decoding one token at batch 1, A100 80GB SXM",
        (107.0 / 25.5, 107.0 / 25.5), both.speedup,
        times=[("eager step", both.before.step_s, 1 / 25.5), ("graphed + compiled step", both.after.step_s, 1 / 107.0)],
        details=[f"eager: {both.before.bound}-bound, host {both.before.host_s * ms:.1f} ms, device busy "
                 f"{both.before.device_busy_s * ms:.1f} ms ('heavily CPU overhead bound' in the blog)",
                 f"CUDA graphs alone: {graphs.after.step_s * ms:.1f} ms/token ({graphs.after.bound}-bound; not "
                 "published)"],
        assumptions=["decoding traced as a forward of one token without the KV cache: the cache reads "
                     "(< 1% of the weight bytes at the blog's ~200-token contexts) and gpt-fast's cache "
                     "writes, mask indexing and sampling ops are not in the trace",
                     "reduce-overhead = CUDA graphs + inductor: the items cuda-graphs and torch-compile "
                     "applied together; inductor's own GEMV kernels are timed as cuBLAS's",
                     "the 330 W power limit is not modeled (decoding is memory-bound)",
                     "host: the default profile's dispatch costs on a 3.5 GHz server core (the blog's "
                     "CPU is not named)"],
    )


def recompute_korthikanti() -> Reproduction:
    """Korthikanti et al. 2022: selective vs full recomputation of a 22B GPT layer on A100."""
    kwargs = dict(dtype="bf16", optimizer="none", workers=1)
    full = advise(MEGATRON_SLICE, "a100-80gb-sxm", apply=["checkpoint-full"], **kwargs).combination
    selective = advise(MEGATRON_SLICE, "a100-80gb-sxm", apply=["checkpoint-selective"], **kwargs).combination
    per_layer = {k: v / 2 for k, v in (("no recompute", full.before.step_s), ("full", full.after.step_s),
                                        ("selective", selective.after.step_s))}  # 2 layers traced
    return Reproduction(
        "selective vs full recomputation, GPT 22B layer", "checkpoint-full vs checkpoint-selective",
        "Korthikanti et al. 2022, arXiv:2205.05198: Table 4 (one layer of the 22B model, forward+backward): "
        "baseline no recompute 19.6 ms, with recompute 27.2 ms, selective recompute 20.9 ms; Table 5: "
        "'between 29.0% and 32.1% improvement in the throughput' (full recompute vs selective + sequence "
        "parallelism, 22B to 1T). Table 3 / section 6: hidden 6144, 64 heads, TP 8, micro-batch 4, "
        "sequence 2048, mixed precision, A100 80GB",
        "one tensor-parallel rank's slice of the 22B layer (8 heads, 3072 MLP columns, full hidden size for "
        "norms and dropouts), bf16, batch 4 x 2048, forward + backward of 2 layers (validation/megatron_slice.py)",
        (1.290, 1.321), full.after.step_s / selective.after.step_s,
        times=[(f"layer, {k}", per_layer[k], published) for k, published in
               (("no recompute", 19.6e-3), ("full", 27.2e-3), ("selective", 20.9e-3))],
        details=[f"Table 4's own full/selective ratio: {27.2 / 20.9:.3f}x",
                 f"peak memory (2 layers): full {full.after.peak_bytes / 2**30:.2f} GiB, selective "
                 f"{selective.after.peak_bytes / 2**30:.2f} GiB, none {full.before.peak_bytes / 2**30:.2f} GiB"],
        assumptions=["the tensor-parallel all-reduces (two per layer in forward and backward, two more in "
                     "full recomputation's second forward) are not traced: the slice has no process group; "
                     "the paper attributes full recomputation's 39% (not 33%) overhead to them",
                     "nnperf's selective policy recomputes every non-matmul op (layer norms, GeLU, dropouts "
                     "too), the paper's only the attention core: selective is predicted dearer",
                     "Megatron's fused softmax / bias-GeLU / bias-dropout-add run as separate kernels here"],
    )


def fused_adamw_torchtitan() -> Reproduction:
    """torchtitan PR #881: fused vs foreach AdamW, Llama 3 8B, FSDP over 8 GPUs."""
    gpu = load_gpu("h100-sxm")
    cluster = cluster_for_gpu(gpu.id)
    assert cluster is not None
    request = ModelRequest("llama-7b", batch=1, seq_len=8192,
                           overrides=dict(n_kv_heads=8, ffn_hidden=14336, vocab=128256))
    execution = Execution(world=8, data="fsdp", shard=8, micro_batch=1, checkpoint="selective")
    options = TraceOptions(amp="bf16", optimizer="adamw", optimizer_impl="foreach")
    foreach = evaluate_on_layout(request, options, Change(), execution, gpu, cluster)
    fused = evaluate_on_layout(request, options, Change(trace=(("optimizer_impl", "fused"),)), execution, gpu,
                               cluster)
    return Reproduction(
        "fused vs foreach AdamW, Llama 3 8B FSDP x8", "optimizer-fused on one FSDP rank",
        "github.com/pytorch/torchtitan/pull/881 ('use Fused AdamW as default', 2025-02-24): 'Fused AdamW | "
        "FSDP, eager | 2.24%', FSDP compile 1.63%, TP 3.62% ... 'Min 1.63% Max 3.62%'; workload: "
        "torchtitan's llama3_8b.toml of that time (batch 1, seq_len 8192, selective op AC, FSDP over all GPUs)",
        "Llama 3 8B (dim 4096, 32 layers, 8 KV heads, FFN 14336, vocab 128256), 1 x 8192 tokens per rank, FSDP2 "
        "full shard over 8 H100 SXM (DGX H100 links), selective activation checkpointing, bf16, AdamW",
        (1.0163, 1.0362), foreach.step_s / fused.step_s,
        details=[f"rank step {foreach.step_s:.3f} -> {fused.step_s:.3f} s; FSDP eager published +2.24%",
                 f"per-rank optimizer state {foreach.state_bytes.optimizer_state / 2**30:.2f} GiB "
                 "(1/8 of the model's)"],
        assumptions=["the PR names no GPU; H100 SXM as issue 17 states",
                     "bf16 by autocast (torchtitan: FSDP2 MixedPrecisionPolicy, bf16 parameters, fp32 "
                     "reduce): the same GEMMs, fp32 all-gathers here",
                     "gradient clipping (max_norm 1.0) is not in the traced step: it adds the same time to both",
                     "nnperf's selective checkpointing saves matmul and attention outputs (torchtitan's 'op' "
                     "policy saves every other matmul)"],
    )


ALL = (nanogpt_vocab, channels_last_resnet50, cuda_graphs_gpt_fast, recompute_korthikanti, fused_adamw_torchtitan)


def main() -> None:
    misses = 0
    for reproduce in ALL:
        r = reproduce()
        misses += not r.within
        print("\n".join(r.lines()))
        print(f"    item: {r.item}; setup: {r.setup}")
        for d in r.details:
            print(f"    {d}")
        print(f"    source: {r.source}")
        for a in r.assumptions:
            print(f"    assumes: {a}")
    print(f"{len(ALL) - misses} of {len(ALL)} within tolerance")


if __name__ == "__main__":
    main()
