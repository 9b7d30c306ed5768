"""Build a device profile again from a calibration's raw JSON, with the current derivation.

    python validation/rebuild_profile.py validation/data/h200-sxm/profile.json -o validation/data/h200-sxm/profile.toml
    python validation/rebuild_profile.py RAW.json --kernel-bench kernel-bench.json -o profile.toml
    python validation/rebuild_profile.py RAW.json --host-parts host-parts.json -o profile.toml

The microbenchmarks are the expensive, device-bound part of a calibration; how a profile is
derived from them improves between GPU sessions (``measure.calibration.profile``). This turns a
committed raw file into the profile today's code derives, without a GPU. The raw file itself
is left as it was measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nnperf.hardware import load_gpu
from nnperf.measure.calibration import host_parts
from nnperf.measure.calibration.files import profile_text
from nnperf.measure.calibration.kernel_bench import load_kernel_bench
from nnperf.measure.calibration.record import Calibration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path, help="the calibration's raw JSON (written beside its profile)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the profile TOML to write")
    parser.add_argument("--kernel-bench", type=Path,
                        help="a kernel-bench.json of the same GPU (validation/kernel_bench.py): its rows set "
                             "the kernel constants it measures")
    parser.add_argument("--host-parts", type=Path,
                        help="a host-parts JSON measured on the same machine (python -m "
                             "nnperf.measure.calibration.host_parts): the parts of an eager step's host work, "
                             "for a calibration made before it measured them itself")
    args = parser.parse_args(argv)
    cal = Calibration.from_json(json.loads(args.raw.read_text()))
    if args.host_parts:
        if cal.host_parts:
            parser.error(f"{args.raw} already holds its own host parts; --host-parts would replace them")
        parts = host_parts.load(args.host_parts)
        if parts.device_name != cal.device_name or parts.host_cpu != cal.host_cpu:
            parser.error(f"--host-parts {args.host_parts} was measured on {parts.device_name} ({parts.host_cpu}), "
                         f"the calibration on {cal.device_name} ({cal.host_cpu})")
        cal.host_parts = parts.to_json()
    gpu = load_gpu(cal.device_name) if cal.device.startswith("cuda") else None
    bench = load_kernel_bench(args.kernel_bench) if args.kernel_bench else None
    args.output.write_text(profile_text(cal, gpu, bench))
    print(f"wrote {args.output} ({cal.device_name}, {cal.date}, timing {cal.timing})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
