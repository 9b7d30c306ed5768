"""The dtype vocabulary shared by the catalog and the time models.

Datasheets, PyTorch and users spell dtypes differently ("bfloat16", "bf16", "half",
"torch.float16"); everything in nnperf talks in the short names below so that a peak rate in a
GPU file and a tensor in a trace meet on the same key.
"""

from __future__ import annotations

from nnperf.errors import UsageError

#: Bytes per element of each dtype as stored in memory. tf32 is a math mode, stored as fp32.
DTYPE_BYTES: dict[str, int] = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int32": 4,
}

#: The dtypes a GPU entry may list a peak rate for (int32 is only an output type).
COMPUTE_DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")

_ALIASES: dict[str, str] = {
    "float64": "fp64",
    "double": "fp64",
    "f64": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "fp8e4m3": "fp8",
    "fp8e5m2": "fp8",
    "int32": "int32",
}


def normalize_dtype(dtype: str, *, allow_output_only: bool = False) -> str:
    """Map any common spelling of a dtype to nnperf's short name, or raise a UsageError."""
    key = str(dtype).strip().lower().removeprefix("torch.").replace("-", "").replace("_", "")
    key = {k.replace("_", ""): v for k, v in _ALIASES.items()}.get(key, key)
    valid = COMPUTE_DTYPES + (("int32",) if allow_output_only else ())
    if key not in valid:
        raise UsageError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(valid)}")
    return key
