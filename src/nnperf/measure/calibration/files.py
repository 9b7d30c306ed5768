"""Writing a calibration: the profile TOML, its raw JSON and (CPU) a device file, atomically."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnperf import stopping
from nnperf.hardware import GPU, save_profile
from nnperf.measure.calibration.profile import build_profile, cpu_description, measured_table
from nnperf.measure.calibration.record import Calibration
from nnperf.special_files import is_special


def _toml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_scalar(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def toml_text(raw: dict[str, Any]) -> str:
    """A small TOML writer for nested tables of scalars (the catalog schema needs no more)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []

    def emit(prefix: str, table: dict[str, Any]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if prefix:
            lines.extend(["", f"[{prefix}]"])
        lines.extend(f"{json.dumps(k) if not k.replace('_', '').isalnum() else k} = {_toml_scalar(v)}"
                     for k, v in scalars.items())
        for k, v in table.items():
            if isinstance(v, dict):
                tables.append((f"{prefix}.{k}" if prefix else k, v))

    emit("", raw)
    while tables:
        emit(*tables.pop(0))
    return "\n".join(lines) + "\n"


@dataclass
class Outputs:
    """Where a calibration writes: the profile, its raw sidecar JSON and (CPU) a device file."""

    profile: Path
    raw: Path
    device: Path | None

    @classmethod
    def for_profile(cls, profile: str | Path, device_file: str | Path | None, cpu: bool) -> Outputs:
        p = Path(profile)
        dev = Path(device_file) if device_file else (p.with_name(p.stem + "-device.toml") if cpu else None)
        return cls(profile=p, raw=p.with_suffix(".json"), device=dev)

    def paths(self) -> list[Path]:
        return [p for p in (self.profile, self.raw, self.device) if p is not None]


def profile_text(cal: Calibration, gpu: GPU | None, kernel_bench: dict[str, Any] | None = None) -> str:
    """The profile TOML derived from ``cal`` (and a kernel-bench document's rows, if given),
    with its ``[measured]`` headline table."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "profile.toml"
        save_profile(build_profile(cal, gpu, kernel_bench), scratch)
        return scratch.read_text() + "\n" + toml_text({"measured": measured_table(cal)})


def write_outputs(cal: Calibration, gpu: GPU | None, outputs: Outputs,
                  kernel_bench: dict[str, Any] | None = None) -> None:
    """Write every output atomically: temp files in the same folder, renamed only when all are
    written. An incomplete calibration is refused (nothing is ever written as if complete), and
    nothing is written after a stop signal came (``stopping.check``)."""
    stopping.check()
    if not cal.complete:
        raise ValueError("refusing to write an incomplete calibration as a profile")
    texts: dict[Path, str] = {outputs.profile: profile_text(cal, gpu, kernel_bench)}
    texts[outputs.raw] = json.dumps(cal.to_json(), indent=2) + "\n"
    if outputs.device is not None:
        texts[outputs.device] = "# nnperf device description of this CPU (use with --gpu-file)\n" + toml_text(
            cpu_description(cal)
        )
    staged: list[tuple[Path, Path]] = []
    try:
        for final, text in texts.items():
            if is_special(final):  # /dev/null, a FIFO: written into, never replaced
                final.write_text(text)
                continue
            fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            staged.append((Path(name), final))
        for tmp_path, final in staged:
            os.replace(tmp_path, final)
    finally:
        for tmp_path, _ in staged:
            tmp_path.unlink(missing_ok=True)
