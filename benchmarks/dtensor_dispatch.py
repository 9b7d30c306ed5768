"""The host time a DTensor dispatch adds, on this machine, beside the shipped profile's value.

    python benchmarks/dtensor_dispatch.py [--runs 3]

Runs ``measure.calibration.dtensor_host.dtensor_overheads`` (what ``nnperf calibrate`` runs)
in fresh processes and prints each run's median per dispatch and per list tensor with their
10th-90th percentiles, the median over the runs, and that median scaled to the profile's
reference core (``host_turbo_ghz``) by the ratio of clocks, for the clock given with
``--ghz`` (default: /proc/cpuinfo's "cpu MHz", which a VM may report as its nominal clock).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from nnperf.hardware import default_profile

CODE = ("import json; from nnperf.measure.calibration.dtensor_host import dtensor_overheads; "
        "print(json.dumps(dtensor_overheads()))")


def cpu_ghz() -> float | None:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except OSError:
        return None
    return max(mhz) / 1000 if mhz else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ghz", type=float, default=None, help="this CPU's single-core clock while it ran")
    args = parser.parse_args()
    dispatch, per_tensor = [], []
    for run in range(args.runs):
        done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        d, t = measured["dispatch_s"], measured["list_tensor_s"]
        dispatch.append(d["median"])
        per_tensor.append(t["median"])
        print(f"run {run + 1}: {d['median'] * 1e6:.1f} us per dispatch (p10-p90 {d['p10'] * 1e6:.1f}-"
              f"{d['p90'] * 1e6:.1f}) over {measured['dispatches']} dispatches; {t['median'] * 1e6:.2f} us per "
              f"list tensor (p10-p90 {t['p10'] * 1e6:.2f}-{t['p90'] * 1e6:.2f})")
    profile = default_profile()
    ghz = args.ghz or cpu_ghz()
    d, t = statistics.median(dispatch), statistics.median(per_tensor)
    print(f"median of {args.runs} runs: {d * 1e6:.1f} us per dispatch, {t * 1e6:.2f} us per list tensor")
    if ghz:
        scale = ghz / profile.host_turbo_ghz
        print(f"at the profile's {profile.host_turbo_ghz} GHz reference core (this CPU taken at {ghz:.2f} GHz): "
              f"{d * scale * 1e6:.1f} us and {t * scale * 1e6:.2f} us; shipped: "
              f"{profile.host_dtensor_dispatch_s * 1e6:.1f} us and {profile.host_dtensor_list_tensor_s * 1e6:.2f} us")


if __name__ == "__main__":
    main()
