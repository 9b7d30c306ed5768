"""The microbenchmarks: each fills one part of a ``Calibration`` as it goes, so Ctrl-C leaves
a partial record that is never written as a profile."""

from __future__ import annotations

import contextlib
import datetime
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from nnperf.measure.calibration.host_info import clock_under_load, cpu_max_ghz, cpu_model
from nnperf.measure.calibration.plan import ATTENTION_BACKENDS, CONV_MODES, Plan
from nnperf.measure.calibration.record import Calibration
from nnperf.measure.device import device_name, synchronize, time_batched, time_queued, time_repeats
from nnperf.measure.stats import Spread
from nnperf.passes.costs.attention import kept_pairs

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

Progress = Callable[[str, int], None]  # (benchmark group, items done in it) -> None


def _rand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Random operands: zeros can take fast paths and flatter a kernel."""
    return torch.randn(shape, dtype=dtype, device=device)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> Spread:
    return Spread.of(time_batched(fn, device, repeats=repeats, device_only=True))


def run_calibration(
    device: torch.device,
    plan: Plan,
    progress: Progress | None = None,
    *,
    result: Calibration | None = None,
) -> Calibration:
    """Run every benchmark of ``plan``; ``result`` collects as it goes (partial on Ctrl-C)."""
    progress = progress or (lambda group, n: None)
    cal = result or new_calibration(device, quick=False)
    _matmuls(cal, device, plan, progress)
    if device.type == "cuda":
        _clock(cal, device, plan)
    _convs(cal, device, plan, progress)
    _conv_variants(cal, device, plan, progress)
    _bandwidths(cal, device, plan, progress)
    _overheads(cal, device, plan, progress)
    _dispatch_by_kind(cal, device, plan, progress)
    _dtensor(cal, device, plan, progress)
    if device.type == "cuda":
        _host_parts(cal, device, progress)
        _transfers(cal, device, plan, progress)
        _attention(cal, device, plan, progress)
    cal.complete = True
    return cal


def new_calibration(device: torch.device, quick: bool) -> Calibration:
    return Calibration(
        device=str(device),
        device_name=device_name(device),
        quick=quick,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        torch_version=torch.__version__,
        threads=torch.get_num_threads(),
        host_cpu=cpu_model(),
        host_max_ghz=cpu_max_ghz(),
    )


def _clock(cal: Calibration, device: torch.device, plan: Plan) -> None:
    """The SM clock while the largest GEMM of the plan runs back to back (sustained load)."""
    n = max(plan.gemm_sizes)
    dtype = next((d for d in ("bf16", "fp16") if d in plan.gemm_dtypes), plan.gemm_dtypes[0])
    a, b = _rand((n, n), TORCH_DTYPES[dtype], device), _rand((n, n), TORCH_DTYPES[dtype], device)
    cal.clock_under_load_mhz = clock_under_load(lambda: torch.mm(a, b), lambda: synchronize(device),
                                                device.index or 0, seconds=1.0 if cal.quick else 3.0)


def _gemm_row(cal_rows: list, dtype: str, kind: str, a: torch.Tensor, b: torch.Tensor,
              device: torch.device, repeats: int) -> None:
    batch = a.shape[0] if a.dim() == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    fn = (lambda: torch.bmm(a, b)) if a.dim() == 3 else (lambda: torch.mm(a, b))
    spread = _timed(fn, device, repeats)
    flops = 2.0 * batch * m * n * k
    row = {"dtype": dtype, "kind": kind, "m": m, "n": n, "k": k, "flops": flops,
           "time_s": spread.median, "spread": spread.to_json(), "flops_per_s": flops / spread.median}
    if a.dim() == 3:
        row["batch"] = batch
    cal_rows.append(row)


def _matmul_shapes(plan: Plan) -> Iterator[tuple[str, str, tuple[int, ...], tuple[int, ...]]]:
    """(progress group, kind, A shape, B shape) of every matrix product the plan measures."""
    big = max(plan.gemm_sizes)
    for n in plan.gemm_sizes:
        yield "gemm", "square", (n, n), (n, n)
        yield "gemm", "misaligned", (n + 1, n + 1), (n + 1, n + 1)
        yield "gemm", "skinny", (plan.skinny_m, n), (n, n)
    for m in plan.small_m:
        yield "gemm", "small_m", (m, big), (big, big)
    for batch, m, n, k in plan.batched_gemm:
        yield "batched gemm", "batched", (batch, m, k), (batch, k, n)


@contextlib.contextmanager
def _tf32_restored() -> Iterator[None]:
    """Benchmarks switch TF32 per measurement; the user's settings come back afterwards."""
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def _matmuls(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    done = {"gemm": 0, "batched gemm": 0}
    with _tf32_restored():
        for dtype in plan.gemm_dtypes:
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            tdt = TORCH_DTYPES[dtype]
            for group, kind, a_shape, b_shape in _matmul_shapes(plan):
                rows = cal.gemm if group == "gemm" else cal.batched_gemm
                _gemm_row(rows, dtype, kind, _rand(a_shape, tdt, device), _rand(b_shape, tdt, device),
                          device, plan.repeats)
                done[group] += 1
                progress(group, done[group])


def _convs(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    tdt = TORCH_DTYPES[plan.conv_dtype]
    for i, (b, cin, hw, cout, ks, stride) in enumerate(plan.conv_shapes, 1):
        x = _rand((b, cin, hw, hw), tdt, device)
        w = _rand((cout, cin, ks, ks), tdt, device)
        pad = ks // 2
        spread = _timed(lambda x=x, w=w, s=stride, p=pad: F.conv2d(x, w, stride=s, padding=p), device, plan.repeats)
        out_hw = (hw + 2 * pad - ks) // stride + 1
        flops = 2.0 * b * cout * out_hw * out_hw * cin * ks * ks
        cal.conv.append({
            "dtype": plan.conv_dtype, "batch": b, "in_channels": cin, "hw": hw, "out_channels": cout,
            "kernel": ks, "stride": stride, "flops": flops, "time_s": spread.median,
            "spread": spread.to_json(), "flops_per_s": flops / spread.median,
        })
        progress("conv", i)


def _conv_variants(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    """Depthwise, grouped and dense convolutions per memory format, dtype and TF32 setting:
    time and the bytes the real tensors hold (a depthwise convolution reads and writes its
    activations once and does little arithmetic, so bandwidth is its natural unit)."""
    done = 0
    with _tf32_restored():
        for b, cin, hw, cout, ks, stride, groups in plan.conv_variants:
            for layout, dtype, tf32 in CONV_MODES:
                if device.type != "cuda" and (dtype != "fp32" or not tf32):
                    continue  # a CPU has no TF32, and bf16 convolutions are not its case
                torch.backends.cudnn.allow_tf32 = tf32
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                tdt = TORCH_DTYPES[dtype]
                x = _rand((b, cin, hw, hw), tdt, device).to(memory_format=fmt)
                w = _rand((cout, cin // groups, ks, ks), tdt, device).to(memory_format=fmt)
                pad = ks // 2
                spread = _timed(lambda x=x, w=w, s=stride, p=pad, g=groups: F.conv2d(x, w, stride=s, padding=p, groups=g),
                                device, plan.repeats)
                out_hw = (hw + 2 * pad - ks) // stride + 1
                flops = 2.0 * b * cout * out_hw * out_hw * (cin // groups) * ks * ks
                nbytes = (x.numel() + w.numel() + b * cout * out_hw * out_hw) * x.element_size()
                cal.conv_variants.append({
                    "kind": "depthwise" if groups == cin == cout else ("grouped" if groups > 1 else "dense"),
                    "dtype": dtype, "layout": layout, "tf32": tf32, "batch": b, "in_channels": cin, "hw": hw,
                    "out_channels": cout, "kernel": ks, "stride": stride, "groups": groups, "flops": flops,
                    "bytes": nbytes, "time_s": spread.median, "spread": spread.to_json(),
                    "flops_per_s": flops / spread.median, "bytes_per_s": nbytes / spread.median,
                })
                done += 1
                progress("conv", len(plan.conv_shapes) + done)


def _bandwidths(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    done = 0
    for size in plan.bandwidth_bytes:
        n = size // 4
        src = _rand((n,), torch.float32, device)
        other = _rand((n,), torch.float32, device)
        dst = torch.empty_like(src)
        for kind, fn, moved in (
            ("copy", lambda d=dst, s=src: d.copy_(s), 2 * n * 4),
            ("elementwise", lambda d=dst, s=src, o=other: torch.add(s, o, out=d), 3 * n * 4),
        ):
            spread = _timed(fn, device, plan.repeats)
            cal.bandwidth.append({
                "kind": kind, "buffer_bytes": n * 4, "bytes_moved": moved, "time_s": spread.median,
                "spread": spread.to_json(), "bytes_per_s": moved / spread.median,
            })
            done += 1
            progress("bandwidth", done)
        del src, other, dst


def _overheads(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    x = _rand((1,), torch.float32, device)
    y = torch.empty_like(x)
    n = plan.tiny_ops

    def loop() -> None:
        for _ in range(n):
            torch.add(x, 1.0, out=y)

    # host side: enqueue cost per op (on a CPU, the whole cost of a tiny op)
    for _ in range(2):
        loop()
    synchronize(device)
    host = []
    for _ in range(plan.repeats):
        t0 = time.perf_counter()
        loop()
        host.append((time.perf_counter() - t0) / n)
        synchronize(device)
    cal.overhead["host_per_op_s"] = Spread.of(host).to_json()
    progress("overhead", 1)
    views = []
    for _ in range(plan.repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            x.view(-1)
        views.append((time.perf_counter() - t0) / n)
    cal.overhead["view_per_op_s"] = Spread.of(views).to_json()
    progress("overhead", 2)
    if device.type == "cuda":
        cal.overhead["device_per_kernel_s"] = Spread.of(time_queued(loop, n, device, plan.repeats)).to_json()
    progress("overhead", 3)


def _dispatch_ops(device: torch.device) -> dict[str, Callable[[], object]]:
    """One small op of each kind in ``DISPATCH_KINDS``, on ``device``."""
    a, b = _rand((8, 8), torch.float32, device), _rand((8, 8), torch.float32, device)
    weight, bias = _rand((8,), torch.float32, device), _rand((8,), torch.float32, device)
    index = torch.arange(4, device=device)
    return {
        "add": lambda: torch.add(a, b),
        "mm": lambda: torch.mm(a, b),
        "sum": lambda: a.sum(dim=1),
        "softmax": lambda: torch.softmax(a, dim=-1),
        "layer_norm": lambda: F.layer_norm(a, (8,), weight, bias),
        "cat": lambda: torch.cat([a, b]),
        "index_select": lambda: a.index_select(0, index),
        "mul_": lambda: b.mul_(1.0),
    }


def _dispatch_by_kind(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    """Host time per op of each kind (enqueue cost on a GPU; the whole op on a CPU)."""
    ops = _dispatch_ops(device)
    n = max(50, plan.tiny_ops // 4)
    by_kind = {}
    for i, kind in enumerate(plan.dispatch_kinds, 1):
        fn = ops[kind]
        for _ in range(n // 10):
            fn()
        synchronize(device)
        samples = []
        for _ in range(plan.repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples.append((time.perf_counter() - t0) / n)
            synchronize(device)
        by_kind[kind] = Spread.of(samples).to_json()
        progress("overhead", 3 + i)
    if by_kind:
        cal.overhead["host_per_op_by_kind_s"] = by_kind


def _host_parts(cal: Calibration, device: torch.device, progress: Progress) -> None:
    """The parts of an eager step's host work beside each op (``host_parts``), on the host
    that drives this GPU."""
    from nnperf.measure.calibration import host_parts

    plan = host_parts.Plan.quick() if cal.quick else host_parts.Plan()
    done = 0

    def step(what: str) -> None:
        nonlocal done
        done += 1
        progress("host parts", done)

    cal.host_parts = host_parts.run(device, plan, step).to_json()


def _dtensor(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    """The host time a DTensor dispatch adds (host work only, measured on CPU tensors whatever
    the device: ``dtensor_host``). A CPU profile has no host beside its device to charge it to,
    so it is measured for GPUs only."""
    from nnperf.measure.calibration.dtensor_host import dtensor_overheads

    measured: dict = {}
    if device.type == "cuda":
        try:
            measured = dtensor_overheads(repeats=plan.repeats, steps=max(5, plan.tiny_ops // 100))
        except Exception as error:  # one host benchmark must not cost the GPU's whole profile
            print(f"nnperf calibrate: the DTensor host benchmark failed ({error!r}); the profile keeps "
                  "the default host_dtensor_dispatch_s", file=sys.stderr)
    if measured:
        cal.overhead["dtensor"] = measured
    progress("dtensor", 1)


def _transfers(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    done = 0
    for size in plan.transfer_bytes:
        dev = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
        for pinned in (False, True):
            host = torch.randint(0, 255, (size,), dtype=torch.uint8)
            if pinned:
                host = host.pin_memory()
            for direction, fn in (
                ("h2d", lambda h=host, d=dev: d.copy_(h, non_blocking=True)),
                ("d2h", lambda h=host, d=dev: h.copy_(d, non_blocking=True)),
            ):
                times = time_repeats(fn, device, warmup=2, repeats=plan.repeats)
                spread = Spread.of(times)
                cal.transfer.append({
                    "direction": direction, "pinned": pinned, "bytes": size, "time_s": spread.median,
                    "spread": spread.to_json(), "bytes_per_s": size / spread.median,
                })
                done += 1
                progress("transfer", done)
        del dev


def _attention(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    """Causal bf16 SDPA on each fused backend, forward alone (no grad) and forward+backward
    (the backward is their difference), with the FLOPs as nnperf counts them
    (``passes.costs.attention``: two products forward, four backward, and the Q@K^T the
    backward recomputes). A backend that refuses the shape is recorded with its reason."""
    done = 0
    for shape in plan.attention_shapes:
        for row in _attention_rows(shape, device, plan.repeats):
            cal.attention.append(row)
            done += 1
            progress("attention", done)


def _attention_rows(shape: tuple[int, int, int, int, int], device: torch.device,
                    repeats: int) -> Iterator[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, heads, tokens, e, ev = shape
    q, k = (_rand((batch, heads, tokens, e), torch.bfloat16, device).requires_grad_() for _ in range(2))
    v = _rand((batch, heads, tokens, ev), torch.bfloat16, device).requires_grad_()
    grad = _rand((batch, heads, tokens, ev), torch.bfloat16, device)
    pairs = batch * heads * kept_pairs(tokens, tokens, True)
    facts = {"dtype": "bf16", "batch": batch, "heads": heads, "tokens": tokens, "head_dim": e,
             "head_dim_v": ev, "causal": True, "forward_flops": 2.0 * pairs * (e + ev),
             "backward_flops": 4.0 * pairs * (e + ev), "recompute_flops": 2.0 * pairs * e}

    for name, backend in ATTENTION_BACKENDS.items():
        row = {"backend": backend, **facts}
        # cuDNN's kernel takes only a model's projection layout, [B, H, S, D] views of
        # [B, S, H, D] (``check_cudnn_layout``, ``kernels.attention``): copies laid out so
        tensors = [_projected(t) for t in (q, k, v)] if name == "CUDNN_ATTENTION" else [q, k, v]
        forward, step = _sdpa_steps(*tensors, grad)
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                fwd, both = _timed(forward, device, repeats), _timed(step, device, repeats)
        except RuntimeError as err:  # this backend does not take the shape
            row["skipped"] = str(err).strip().splitlines()[0][:200]
        else:
            _record_times(row, fwd, both)
        yield row
    yield _flex_row(facts, (q, k, v, grad), device, repeats)


def _projected(t: torch.Tensor) -> torch.Tensor:
    """A copy of [B, H, S, D] ``t`` as a [B, H, S, D] view of [B, S, H, D] memory."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()


def _sdpa_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                grad: torch.Tensor) -> tuple[Callable[[], None], Callable[[], None]]:
    """Causal SDPA forward alone (no grad), and forward with backward."""
    def forward() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def step() -> None:
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return forward, step


def _record_times(row: dict, forward: Spread, both: Spread) -> None:
    row.update(forward_s=forward.median, backward_s=max(both.median - forward.median, 1e-9),
               spread=both.to_json(), forward_spread=forward.to_json())


#: The block size of FlexAttention's BlockMask (``_DEFAULT_SPARSE_BLOCK_SIZE``).
FLEX_BLOCK = 128


def _flex_row(facts: dict, tensors: tuple[torch.Tensor, ...], device: torch.device, repeats: int) -> dict:
    """``torch.compile(flex_attention)`` under a causal BlockMask on the same tensors, as
    torchtitan runs it; ``executed_pairs``: the pairs of the blocks its kernel computes (the
    diagonal and those below it), what the time model charges it for
    (``passes.costs.attention``). Its first call compiles (inside the warm-up)."""
    row = {"backend": "flex", **facts}
    if device.type != "cuda":
        row["skipped"] = "FlexAttention's fused kernels and its backward need a CUDA GPU"
        return row
    q, k, v, grad = tensors
    n = -(-facts["tokens"] // FLEX_BLOCK)
    row["executed_pairs"] = facts["batch"] * facts["heads"] * n * (n + 1) // 2 * FLEX_BLOCK * FLEX_BLOCK
    try:
        from torch.nn.attention.flex_attention import create_block_mask

        from nnperf.zoo._attention import compiled_flex_attention

        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, facts["tokens"], facts["tokens"],
                                 device=device)
        flex = compiled_flex_attention()

        def forward() -> None:
            with torch.no_grad():
                flex(q, k, v, block_mask=mask)

        def step() -> None:
            q.grad = k.grad = v.grad = None
            flex(q, k, v, block_mask=mask).backward(grad)

        fwd, both = _timed(forward, device, repeats), _timed(step, device, repeats)
    except Exception as err:  # no FlexAttention in this torch, or no kernel for the shape
        row["skipped"] = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    else:
        _record_times(row, fwd, both)
    return row
