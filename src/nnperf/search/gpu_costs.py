"""What a step costs on a GPU: one row per GPU with its price per million samples.

Shared by ``nnperf compare`` (a table of GPUs) and ``nnperf advise`` (the GPU items), so the
rule is written once: a step that does not fit in the GPU's memory has no cost (it cannot run
there as configured, so its price per sample would be a number for nothing).
"""

from __future__ import annotations

from typing import Any


def usd_per_million_samples(price: float | None, samples_per_s: float, fits: bool) -> float | None:
    """USD for a million samples at ``price`` per GPU-hour; None without a price, or if it does not fit."""
    return price / 3600 / samples_per_s * 1e6 if price and samples_per_s and fits else None


def gpu_row(name: str, gpu: Any, tot: dict[str, Any], prices: dict[str, float]) -> dict[str, Any]:
    """One GPU's line of ``compare`` from a prediction's totals and the user's prices."""
    price = prices.get(name, prices.get(gpu.id, gpu.price_usd_per_hour))
    fits = tot["fits_in_memory"]
    return {
        "gpu": gpu.name, "id": gpu.id, "step_time_s": tot["step_time_s"], "throughput": tot["throughput"],
        "throughput_unit": tot["throughput_unit"], "bound": tot["bound"], "mfu": tot["mfu"],
        "device_total_bytes": tot["device_total_bytes"], "gpu_memory_bytes": tot["gpu_memory_bytes"],
        "fits_in_memory": fits,
        "usd_per_hour": price, "price_date": None if name in prices else gpu.price_date,
        "usd_per_million_samples": usd_per_million_samples(price, tot["samples_per_s"], fits),
    }
