"""``nnperf calibrate``: microbenchmarks that replace the generic efficiency constants.

Measured, on the device asked for:

* GEMM throughput over a grid of shapes (square, aligned and misaligned, and skinny
  batch-like ones) and dtypes;
* convolution throughput for common CNN shapes, relative to a GEMM of the same FLOPs (a
  uniform scale on the profile's per-class convolution efficiencies);
* achievable memory bandwidth (copy and elementwise add) from cache-resident to large sizes;
* the cost of one tiny op: host dispatch (a loop of tiny ops timed on the host) and, on CUDA,
  the device time per back-to-back kernel (enqueued behind ``torch.cuda._sleep`` so the host
  cannot be the bottleneck);
* on CUDA, host<->device bandwidth and latency, pageable and pinned, 4 KB to 1 GB;
* for a GPU's profile, the host time a DTensor dispatch adds (``dtensor_host``: host work
  only, timed on CPU tensors in a fake 8-rank world).

The results become a ``DeviceProfile`` (``save_profile`` format, plus a ``[measured]`` table of
headline figures) and a sidecar JSON of every raw measurement. On the CPU they also become a
device description in the GPU catalog schema, so the same time model can predict CPU steps:
peak rates are the best GEMM rate measured per dtype, bandwidth the best copy bandwidth,
``sm_count`` the intra-op threads. Because a CPU runs dispatch and math on one thread (no
asynchronous device), the CPU profile charges each op's whole fixed cost as
``kernel_overhead_s`` and sets the host dispatch costs to ~0, so the eager timeline of
``passes/timing.py`` adds op costs serially instead of overlapping host and device.
"""

from __future__ import annotations

from nnperf.measure.calibration.benchmarks import TORCH_DTYPES, new_calibration, run_calibration
from nnperf.measure.calibration.files import Outputs, toml_text, write_outputs
from nnperf.measure.calibration.plan import Plan, plan_for
from nnperf.measure.calibration.profile import (
    build_profile,
    conv_efficiency_scale,
    cpu_description,
    measured_table,
    peak_for_fraction,
)
from nnperf.measure.calibration.record import SCHEMA_VERSION, Calibration

__all__ = [
    "SCHEMA_VERSION",
    "TORCH_DTYPES",
    "Calibration",
    "Outputs",
    "Plan",
    "build_profile",
    "conv_efficiency_scale",
    "cpu_description",
    "measured_table",
    "new_calibration",
    "peak_for_fraction",
    "plan_for",
    "run_calibration",
    "toml_text",
    "write_outputs",
]
