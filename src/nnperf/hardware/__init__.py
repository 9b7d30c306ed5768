"""GPU facts (the catalog) and the efficiency constants the time models apply to them."""

from __future__ import annotations

from nnperf.hardware.catalog import GPU, HostLink, PeakRate, list_gpus, load_gpu
from nnperf.hardware.dtypes import DTYPE_BYTES, normalize_dtype
from nnperf.hardware.profile import DeviceProfile, default_profile, load_profile, save_profile

__all__ = [
    "DTYPE_BYTES",
    "GPU",
    "DeviceProfile",
    "HostLink",
    "PeakRate",
    "default_profile",
    "list_gpus",
    "load_gpu",
    "load_profile",
    "normalize_dtype",
    "save_profile",
]
