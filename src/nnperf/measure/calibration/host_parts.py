"""The host's share of an eager step, part by part, measured on the host it runs on.

A bare op in a loop (``nnperf calibrate``'s ``host_per_op_s``) is not what an op costs inside
a real step: there it also records an autograd node, runs under autocast, is one of several
ops an ``nn.Module`` call wraps, and the backward engine later runs a node for it; the
optimizer adds Python per parameter, ``zero_grad`` a loop over the parameters, and ``.item()``
waits for the device. On the H200's cloud VM real eager steps took 1.6-3.6x what the bare op
predicted (issue #35). Each part is measured here on its own, as the difference of two loops
that differ by that part alone, so the time model (``passes.host_time``) can add them up from
what the trace counts:

==========================  =================================================================
``op_s``                    a small op called from Python (``torch.add`` on 8x8, no grad)
``autograd_record_s``       what recording an autograd node adds to a forward op
``view_s``                  a view with a size argument (``x.view(64)``), no grad
``view_autograd_s``         what a view of a tensor that requires grad adds (its backward node)
``module_call_s``           ``nn.Module.__call__`` around a forward that returns its input
``module_hook_s``           what one forward hook on that module adds
``autocast_op_s``           what an op run inside ``torch.autocast`` adds (its dispatch key)
``backward_node_s``         the engine's cost per backward node that launches nothing
                            (``AddBackward0`` of ``x + 1``: the gradient passes through)
``backward_call_s``         ``backward()``'s own cost beside its nodes (the chain's intercept:
                            on a GPU the engine's device thread takes the work and the caller
                            waits for it)
``backward_op_s``           what a node that dispatches one op (``MulBackward0``'s mul) adds
                            over one that passes its gradient through
``python_call_s``           what a call from Python adds to the same op dispatched from C++:
                            ``torch.mul`` of a strided tensor against the per-tensor slope of
                            ``torch._foreach_mul`` over strided tensors (not dense, so its
                            slow path calls the same mul from C++ for each)
``conv_op_s``               a small convolution called from Python (on a GPU, cuDNN's: its
                            descriptors and execution plan looked up, its kernel launched)
``zero_grad_param_s``       ``optimizer.zero_grad(set_to_none=True)`` per parameter
``sync_s``                  ``.item()`` of a device scalar with the device idle (a round trip)
``in_context``              a kernel-launching op in a stream of different ops over the same
                            ops in tight loops (a ratio): a real step's ops run with the
                            instruction caches and branch predictors holding other ops' code
``optimizer``               per optimizer, implementation: the step's fixed cost and its cost
                            per parameter (slope between 8 and 64 parameters)
==========================  =================================================================

Tiny tensors, so the kernels (on a CPU, the op itself) cost little beside the host work. Host
work is deterministic and other processes only ever add to it, so each figure is the fastest
of its repeated loops (``timeit``'s rule), and a part is the difference of two such figures;
``spreads`` keeps every loop's spread so a noisy host shows.

    python -m nnperf.measure.calibration.host_parts --device cuda --out host-parts.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnperf.measure.stats import Spread

SCHEMA = "nnperf.host_parts/1"
#: Parameter counts of the optimizer benchmark: the per-parameter cost is the slope between them.
OPTIMIZER_PARAMS = (8, 64)
#: (optimizer, implementation) pairs measured: PyTorch's AdamW and SGD with momentum in each of
#: its implementations (for-loop "single", multi-tensor "foreach", "fused").
OPTIMIZERS = (("adamw", "single"), ("adamw", "foreach"), ("adamw", "fused"),
              ("sgd-momentum", "single"), ("sgd-momentum", "foreach"), ("sgd-momentum", "fused"))
#: Backward chain lengths: the per-node cost is the slope between them.
CHAIN = (8, 40)


@dataclass(frozen=True)
class Plan:
    """How long each part is measured: ``repeats`` loops of ``calls`` calls."""

    calls: int = 400
    repeats: int = 15

    @classmethod
    def quick(cls) -> Plan:
        return cls(calls=50, repeats=3)


@dataclass
class HostParts:
    """Seconds per part on one host (the fastest repeat; ``spreads`` keeps each part's spread)."""

    device: str
    device_name: str
    host_cpu: str
    torch_version: str
    date: str
    quick: bool
    parts: dict[str, float] = field(default_factory=dict)
    spreads: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "optimizer/impl" -> {"step_s": fixed cost, "param_s": cost per parameter}
    optimizers: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # part -> why it could not be measured
    complete: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_call(fn: Callable[[], object], device: torch.device, plan: Plan, calls: int | None = None) -> list[float]:
    """Host seconds per call of ``fn`` for each of ``plan.repeats`` loops (device drained
    between loops, so a GPU's launch queue never fills and blocks the host)."""
    n = calls or plan.calls
    for _ in range(max(2, n // 10)):
        fn()
    _sync(device)
    out = []
    for _ in range(plan.repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - start) / n)
        _sync(device)
    return out


def _difference(with_part: list[float], without: list[float]) -> list[float]:
    """The part's samples: each loop of ``with_part`` less the fastest loop without it (the
    fastest of these is then the difference of the two fastest loops)."""
    floor = min(without)
    return [a - floor for a in with_part]


def _record(result: HostParts, name: str, samples: list[float]) -> None:
    spread = Spread.of(samples)
    result.parts[name] = spread.minimum
    result.spreads[name] = spread.to_json()


class _Passthrough(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def measure_ops(result: HostParts, device: torch.device, plan: Plan) -> None:
    """Ops, autograd recording, views and autocast."""
    a = torch.randn(8, 8, device=device)
    b = torch.randn(8, 8, device=device)
    leaf = torch.randn(8, 8, device=device, requires_grad=True)
    bare = _per_call(lambda: torch.add(a, b), device, plan)
    _record(result, "op_s", bare)
    recorded = _per_call(lambda: torch.add(leaf, b), device, plan)
    _record(result, "autograd_record_s", _difference(recorded, bare))
    view = _per_call(lambda: a.view(64), device, plan)
    _record(result, "view_s", view)
    _record(result, "view_autograd_s", _difference(_per_call(lambda: leaf.view(64), device, plan), view))
    image, kernel = torch.randn(1, 8, 8, 8, device=device), torch.randn(8, 8, 3, 3, device=device)
    _record(result, "conv_op_s", _per_call(lambda: torch.nn.functional.conv2d(image, kernel, padding=1), device, plan))
    dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    with torch.autocast(device.type, dtype=dtype):
        inside = _per_call(lambda: torch.add(a, b), device, plan)
    _record(result, "autocast_op_s", _difference(inside, bare))


def _op_mix(device: torch.device) -> list[Callable[[], object]]:
    """Different small ops, as a model's step runs them one after another: elementwise,
    activations, reductions, normalizations, matrix products, copies, indexing. On a CPU the
    tensors have no rows, so only the host path runs (a CPU's kernels are host code too)."""
    import torch.nn.functional as F

    rows = 0 if device.type == "cpu" else 8
    a, b = torch.randn(rows, 8, device=device), torch.randn(rows, 8, device=device)
    w, bias, square = torch.randn(8, device=device), torch.randn(8, device=device), torch.randn(8, 8, device=device)
    batched, batched_w = torch.randn(2, rows, 8, device=device), torch.randn(2, 8, 8, device=device)
    table, ids = torch.randn(16, 8, device=device), torch.zeros(rows, dtype=torch.long, device=device)
    mask = a > 0
    return [
        lambda: torch.add(a, b), lambda: torch.mul(a, b), lambda: torch.relu(a), lambda: F.gelu(a),
        lambda: torch.softmax(a, -1), lambda: F.layer_norm(a, (8,), w, bias), lambda: torch.mm(a, square),
        lambda: torch.bmm(batched, batched_w), lambda: a.t().contiguous(), lambda: torch.cat([a, b]),
        lambda: a.sum(1), lambda: a.mean(0), lambda: torch.sub(a, b), lambda: torch.div(a, b),
        lambda: torch.exp(a), lambda: torch.tanh(a), lambda: torch.sigmoid(a), lambda: torch.where(mask, a, b),
        lambda: a.masked_fill(mask, 0.0), lambda: F.embedding(ids, table), lambda: torch.addmm(bias, a, square),
        lambda: F.linear(a, square, bias), lambda: a.pow(2), lambda: torch.clamp(a, -1, 1),
    ]


def measure_in_context(result: HostParts, device: torch.device, plan: Plan) -> None:
    """The mixed stream's cost per op over the mean of the same ops' tight loops."""
    ops = _op_mix(device)

    def stream() -> None:
        for op in ops:
            op()

    tight = sum(min(_per_call(op, device, plan)) for op in ops) / len(ops)
    mixed = [t / len(ops) for t in _per_call(stream, device, plan, calls=max(5, plan.calls // len(ops) * 2))]
    _record(result, "in_context", [max(1.0, t / tight) for t in mixed])


def measure_modules(result: HostParts, device: torch.device, plan: Plan) -> None:
    """``nn.Module.__call__`` and a forward hook on it, against calling a plain function."""
    x = torch.randn(8, device=device)
    module = _Passthrough()
    plain = _per_call(lambda: _identity(x), device, plan)
    called = _per_call(lambda: module(x), device, plan)
    _record(result, "module_call_s", _difference(called, plain))
    handle = module.register_forward_hook(lambda m, args, out: None)
    try:
        hooked = _per_call(lambda: module(x), device, plan)
    finally:
        handle.remove()
    _record(result, "module_hook_s", _difference(hooked, called))


def _chain_backward(op: Callable[[torch.Tensor], torch.Tensor], length: int, device: torch.device,
                    plan: Plan) -> list[float]:
    """Host seconds of ``backward()`` through ``length`` nodes of ``op`` (the graph is built
    again outside the timed region before each backward)."""
    leaf = torch.randn(8, 8, device=device, requires_grad=True)
    seed = torch.ones(8, 8, device=device)
    calls = max(4, plan.calls // length)
    out = []
    for repeat in range(plan.repeats + 2):
        total = 0.0
        for _ in range(calls):
            z = leaf
            for _ in range(length):
                z = op(z)
            _sync(device)
            start = time.perf_counter()
            z.backward(seed)
            total += time.perf_counter() - start
            leaf.grad = None
        _sync(device)
        if repeat >= 2:  # the first two warm the engine (its device threads start on first use)
            out.append(total / calls)
    return out


def measure_backward(result: HostParts, device: torch.device, plan: Plan) -> None:
    """Per backward node: the slope of backward time over chain length, for nodes that launch
    nothing (``x + 1``) and nodes that launch one mul (``x * c``)."""
    short, long = CHAIN
    const = torch.full((8, 8), 1.0001, device=device)

    def slope(op: Callable[[torch.Tensor], torch.Tensor]) -> list[float]:
        shorter = min(_chain_backward(op, short, device, plan))
        return [(b - shorter) / (long - short) for b in _chain_backward(op, long, device, plan)]

    shorter = _chain_backward(lambda z: z + 1.0, short, device, plan)
    longer = _chain_backward(lambda z: z + 1.0, long, device, plan)
    passing = [(b - min(shorter)) / (long - short) for b in longer]
    launching = slope(lambda z: z * const)
    _record(result, "backward_node_s", passing)
    per_node = min(passing)
    _record(result, "backward_call_s", [t - short * per_node for t in shorter])
    _record(result, "backward_op_s", _difference(launching, passing))


def measure_python_call(result: HostParts, device: torch.device, plan: Plan) -> None:
    """A mul called from Python against the same mul called from C++ (``_foreach_mul``'s
    slow path over tensors that are not dense: a slice with step 2)."""
    many, few = 64, 8
    strided = [torch.randn(16, 8, device=device)[::2] for _ in range(many)]
    fewer = min(_per_call(lambda: torch._foreach_mul(strided[:few], 1.0001), device, plan,
                          calls=max(5, plan.calls // few)))
    more = min(_per_call(lambda: torch._foreach_mul(strided, 1.0001), device, plan,
                         calls=max(5, plan.calls // many)))
    from_cxx = (more - fewer) / (many - few)
    python_mul = _per_call(lambda: torch.mul(strided[0], 1.0001), device, plan)
    _record(result, "python_call_s", [t - from_cxx for t in python_mul])


def _zero_grad_seconds(n: int, device: torch.device, plan: Plan) -> list[float]:
    """Host seconds of ``zero_grad(set_to_none=True)`` over ``n`` parameters that hold
    gradients (given back, untimed, before each call)."""
    params = [torch.zeros(4, device=device, requires_grad=True) for _ in range(n)]
    grads = [torch.ones_like(p) for p in params]
    opt = torch.optim.SGD(params, lr=0.1)
    calls = max(5, plan.calls // 8)
    out = []
    for repeat in range(plan.repeats + 1):
        total = 0.0
        for _ in range(calls):
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            total += time.perf_counter() - start
        if repeat:
            out.append(total / calls)
    return out


def measure_step_parts(result: HostParts, device: torch.device, plan: Plan) -> None:
    """``zero_grad`` per parameter and a device round trip (``.item()``)."""
    small, large = OPTIMIZER_PARAMS
    fewer = min(_zero_grad_seconds(small, device, plan))
    _record(result, "zero_grad_param_s",
            [(b - fewer) / (large - small) for b in _zero_grad_seconds(large, device, plan)])
    scalar = torch.ones((), device=device)
    _record(result, "sync_s", _per_call(lambda: scalar.item(), device, plan))


def _optimizer(name: str, impl: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    flags = {"foreach": impl == "foreach"} if impl != "fused" else {"fused": True}
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, **flags)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)


def measure_optimizers(result: HostParts, device: torch.device, plan: Plan) -> None:
    """Each optimizer implementation's step: fixed cost and cost per parameter (the slope
    between ``OPTIMIZER_PARAMS`` parameters of 8 elements)."""
    small, large = OPTIMIZER_PARAMS
    for name, impl in OPTIMIZERS:
        key = f"{name}/{impl}"
        try:
            steps = {}
            for n in OPTIMIZER_PARAMS:
                params = [torch.randn(8, device=device, requires_grad=True) for _ in range(n)]
                for p in params:
                    p.grad = torch.randn_like(p)
                opt = _optimizer(name, impl, params)
                steps[n] = _per_call(opt.step, device, plan, calls=max(5, plan.calls // (n // 4)))
        except (RuntimeError, ValueError) as error:  # an implementation this device lacks
            result.skipped[key] = str(error).splitlines()[0]
            continue
        param_s = (min(steps[large]) - min(steps[small])) / (large - small)
        fixed = min(steps[small]) - small * param_s
        result.optimizers[key] = {"step_s": max(0.0, fixed), "param_s": param_s}


#: The measurements in order, each named for progress lines.
PARTS: tuple[tuple[str, Callable[[HostParts, torch.device, Plan], None]], ...] = (
    ("ops and views", measure_ops), ("ops in a mixed stream", measure_in_context),
    ("module calls", measure_modules), ("backward engine", measure_backward),
    ("calls from Python", measure_python_call), ("zero_grad and syncs", measure_step_parts),
    ("optimizers", measure_optimizers),
)


def run(device: torch.device, plan: Plan, progress: Callable[[str], None] | None = None,
        result: HostParts | None = None) -> HostParts:
    """Every part on ``device``; ``result`` fills as it goes (partial on Ctrl-C)."""
    from nnperf.measure.calibration.host_info import cpu_model
    from nnperf.measure.device import device_name

    result = result or HostParts(
        device=str(device), device_name=device_name(device), host_cpu=cpu_model(),
        torch_version=torch.__version__, quick=plan == Plan.quick(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    say = progress or (lambda what: None)
    for what, part in (("ops and views", measure_ops), ("ops in a mixed stream", measure_in_context),
                       ("module calls", measure_modules),
                       ("backward engine", measure_backward), ("calls from Python", measure_python_call), ("zero_grad and syncs", measure_step_parts),
                       ("optimizers", measure_optimizers)):
        say(what)
        part(result, device, plan)
    result.complete = True
    return result


def write(result: HostParts, out: Path) -> None:
    """Atomically: an interrupted run leaves the old file, never half of a new one."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    os.replace(tmp, out)


def load(path: str | Path) -> HostParts:
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a host-parts file (schema {SCHEMA})")
    doc.pop("schema")
    return HostParts(**doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="few calls: a dry run of every path")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    result = run(device, Plan.quick() if args.quick else Plan(),
                 lambda what: print(f"host parts: {what}", file=sys.stderr, flush=True))
    write(result, args.out)
    for name, value in result.parts.items():
        print(f"{name:<22}{value:9.2f} x" if name == "in_context" else f"{name:<22}{value * 1e6:9.2f} us")
    for name, value in result.optimizers.items():
        print(f"{name:<22}{value['step_s'] * 1e6:9.2f} us + {value['param_s'] * 1e6:.2f} us/param")
    for name, why in result.skipped.items():
        print(f"{name:<22} not measured: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
