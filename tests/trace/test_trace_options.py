"""A step's options in words (titles of every report): the precision is always said."""

from __future__ import annotations

from nnperf.trace.options import TraceOptions


def test_the_precision_is_said_even_when_left_at_fp32():
    """No --amp and no --dtype plans the model as built, in fp32: the title says so instead of
    leaving a user to guess which precision a 59% MFU was against."""
    assert TraceOptions().describe() == "training, adamw (foreach), fp32"
    assert TraceOptions(dtype="bf16").describe() == "training, adamw (foreach), bf16"
    assert TraceOptions(amp="bf16").describe() == "training, adamw (foreach), amp bf16"
    assert TraceOptions(dtype="fp32").describe() == "training, adamw (foreach), fp32"
