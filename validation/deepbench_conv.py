"""cuDNN convolutions against cuBLAS GEMMs of the same implicit-GEMM shape, from Baidu DeepBench.

    python validation/deepbench_conv.py             # the derivation (reads the committed CSVs)
    python validation/deepbench_conv.py --rows      # ... and every convolution pass it used
    python validation/deepbench_conv.py --extract V100.xlsx T4.xlsx   # re-extract the CSVs

Where ``conv_efficiency`` in ``src/nnperf/hardware/default_profile.toml`` comes from. DeepBench
(github.com/baidu-research/DeepBench @da81ba7) published, for one V100 SXM2 (DGX-1) and one
T4, each under CUDA 10.1.243 / cuDNN 7.6.2, the times of cuBLAS GEMMs (``gemm_bench.cu``,
``cublasGemmEx``) and of cuDNN convolutions (``conv_bench.cu``: forward, data gradient and
weight gradient, each the mean of 300 back-to-back calls after one warm-up) in two sheets:

* "Results - FP16 ip, Mixed math": fp16 tensors in NHWC with ``CUDNN_TENSOR_OP_MATH`` and the
  algorithms fixed to IMPLICIT_PRECOMP_GEMM / BWD_DATA_ALGO_1 / BWD_FILTER_ALGO_1 (tensor-core
  implicit GEMMs; C and K padded to multiples of 8 where they were not);
* "Results FP32": fp32 in NCHW on the CUDA cores, each algorithm the fastest of
  ``cudnnFind*`` (the sheet names the forward one: implicit GEMM, Winograd, FFT ...).

``validation/data/deepbench/{gemm,conv}.csv`` hold those sheets' rows (``--extract`` writes
them from the two xlsx files; the header of each names the source, commit, blob and sheet).

The derivation, per GPU and sheet:

1. The GEMM model's bias on that GPU: median of measured / modelled time over the sheet's
   GEMMs of >= 0.1 ms that the model calls compute-bound (fp16: M, N, K multiples of 8, as
   DeepBench's own padding leaves the tensor-core convolutions).
2. Each convolution pass of >= 0.1 ms whose implicit GEMM (``passes/costs/matmul.py``: forward
   (NPQ, K, CRS), data gradient (NPQ, C, KRS), weight gradient (K, CRS, NPQ)) the model calls
   compute-bound against the conv's real tensors (fp16: C and K multiples of 8, the rows
   DeepBench did not pad) gives
   ``efficiency = model compute time / (measured time / GEMM bias - split-K reduction - launch)``:
   the factor by which ``passes/timing.py`` must divide the GEMM model's compute term so that,
   times the GPU's GEMM bias, it gives the measured time. That is, the convolution relative to
   a cuBLAS GEMM of its shape on the same GPU, net of what the GEMM model already gets wrong.
   On the fp32 sheet the model's compute term includes its Winograd factor for 3x3 stride-1
   forward and data-gradient passes (``winograd_fraction``), as ``passes/timing.py`` applies it.
3. Each pass falls in a class of ``nnperf.hardware.profile.conv_efficiency_class`` (stride,
   output size, pass); each class's value is the median over both GPUs.

It prints the GEMM biases, each class's median, quartiles and n per GPU and pooled, and the
TOML lines for ``default_profile.toml``. ``tests/hardware/test_conv_efficiency.py`` recomputes
the pooled medians from the CSVs and checks the shipped table against them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from nnperf.hardware import load_gpu  # noqa: E402
from nnperf.hardware.profile import (  # noqa: E402
    CONV_LARGE_POSITIONS,
    CONV_PASSES,
    conv_efficiency_class,
    default_profile,
)
from nnperf.kernels.gemm import estimate_gemm  # noqa: E402
from nnperf.passes.costs.matmul import WINOGRAD_MULTIPLIES_PER_TILE, WINOGRAD_TILE  # noqa: E402

DATA = ROOT / "validation" / "data" / "deepbench"
SOURCE = "https://github.com/baidu-research/DeepBench"
COMMIT = "da81ba7"
#: nnperf catalog id -> (xlsx path at COMMIT, its git blob, the machine in its "Specs" sheet)
FILES = {
    "v100-sxm2": ("results/train/DeepBench_NV_V100.xlsx", "49554d9e7b776ebcb556160c71e25ba2c4a97f6a",
                  "NVIDIA DGX-1 (V100 SXM2), Xeon E5-2698 v4, CUDA 10.1.243, cuDNN 7.6.2.24, driver 418.67"),
    "t4": ("results/train/DeepBench_NV_T4.xlsx", "0badb59311f8d5f68e936e311b46ffa5d0e2d462",
           "T4, Xeon Gold 6140, CUDA 10.1.243, cuDNN 7.6.2.24, driver 418.67"),
}
#: nnperf dtype -> sheet name
SHEETS = {"fp16": "Results - FP16 ip, Mixed math", "fp32": "Results FP32"}
#: Kernels shorter than this are left out: launch and timer granularity (the sheet rounds to
#: 1 us) would dominate them.
MIN_MS = 0.1
ITEMSIZE = {"fp16": 2, "fp32": 4}

GEMM_FIELDS = ["gpu", "precision", "app", "m", "n", "k", "trans_a", "trans_b", "ms"]
CONV_FIELDS = ["gpu", "precision", "app", "w", "h", "c", "n", "k", "s", "r", "pad_w", "pad_h",
               "stride_w", "stride_h", "p", "q", "fwd_ms", "dgrad_ms", "wgrad_ms", "fwd_algo"]


# ---- extraction: xlsx -> CSV ----------------------------------------------------------------
_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"


def read_xlsx(path: Path) -> dict[str, list[list[str]]]:
    """Every sheet of an xlsx file as rows of cell texts (the standard library only)."""
    with zipfile.ZipFile(path) as z:
        shared = []
        if "xl/sharedStrings.xml" in z.namelist():
            for si in ElementTree.fromstring(z.read("xl/sharedStrings.xml")).iter(f"{_NS}si"):
                shared.append("".join(t.text or "" for t in si.iter(f"{_NS}t")))
        rels = {r.get("Id"): r.get("Target")
                for r in ElementTree.fromstring(z.read("xl/_rels/workbook.xml.rels"))}
        sheets = {}
        for sheet in ElementTree.fromstring(z.read("xl/workbook.xml")).find(f"{_NS}sheets"):
            target = rels[sheet.get(_REL)].lstrip("/")
            target = target if target.startswith("xl/") else "xl/" + target
            rows = []
            for row in ElementTree.fromstring(z.read(target)).iter(f"{_NS}row"):
                cells = []
                for c in row.findall(f"{_NS}c"):
                    v = c.find(f"{_NS}v")
                    if v is None:
                        cells.append("".join(t.text or "" for t in c.iter(f"{_NS}t")))
                    else:
                        cells.append(shared[int(v.text)] if c.get("t") == "s" else v.text or "")
                rows.append(cells)
            sheets[sheet.get("name")] = rows
    return sheets


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_sheet(rows: list[list[str]], gpu: str, precision: str) -> tuple[list[dict], list[dict]]:
    """The GEMM and convolution rows of one results sheet. Each row's time is checked against
    the sheet's own TFLOPS column (a misread column would not agree with it)."""
    gemms, convs, section = [], [], None
    for row in rows:
        cells = [c.strip() for c in row if c.strip()]
        if not cells:
            continue
        if cells[0].startswith("Dense Matrix"):
            section = "gemm"
            continue
        if cells[0].startswith(("Convolution", "Recurrent")):
            section = "conv" if cells[0].startswith("Convolution") else None
            continue
        if section == "gemm":
            digits = [i for i, c in enumerate(cells) if c.isdigit()]
            if len(digits) < 3:
                continue
            i = digits[0]
            m, n, k = (int(c) for c in cells[i:i + 3])
            numbers = [x for x in map(_number, cells[i + 5:]) if x is not None]
            ms, tflops = numbers[-2], numbers[-1]
            _agree(2 * m * n * k / (ms * 1e9), tflops, cells)
            gemms.append(dict(gpu=gpu, precision=precision, app=cells[0] if i else "", m=m, n=n, k=k,
                              trans_a=cells[i + 3], trans_b=cells[i + 4], ms=ms))
        elif section == "conv" and len(row) > 16 and row[1].strip().isdigit():
            w, h, c, n, k, s, r, pad_w, pad_h, stride_w, stride_h = (int(x) for x in row[1:12])
            p, q = int(row[15]), int(row[16])
            times = [_number(x) for x in row[12:15]]
            macs = n * k * p * q * c * r * s
            for t, tflops in zip(times, row[18:21], strict=True):
                if t is not None and _number(tflops):
                    _agree(2 * macs / (t * 1e9), float(tflops), row)
            convs.append(dict(gpu=gpu, precision=precision, app=row[0].strip(), w=w, h=h, c=c, n=n, k=k,
                              s=s, r=r, pad_w=pad_w, pad_h=pad_h, stride_w=stride_w, stride_h=stride_h,
                              p=p, q=q, fwd_ms=_cell(times[0]), dgrad_ms=_cell(times[1]),
                              wgrad_ms=_cell(times[2]), fwd_algo=row[21].strip() if len(row) > 21 else ""))
    return gemms, convs


def _agree(computed: float, printed: float, row: list[str]) -> None:
    if abs(computed / printed - 1) > 0.01:
        raise SystemExit(f"row {row}: time gives {computed:.3f} TFLOP/s, the sheet prints {printed:.3f}")


def _cell(x: float | None) -> str:
    return "" if x is None else repr(x)


def extract(v100: Path, t4: Path) -> None:
    """Write ``gemm.csv`` and ``conv.csv`` from the two DeepBench training-results files."""
    gemms, convs = [], []
    for gpu, path in (("v100-sxm2", v100), ("t4", t4)):
        sheets = read_xlsx(path)
        for precision, name in SHEETS.items():
            g, c = parse_sheet(sheets[name], gpu, precision)
            gemms += g
            convs += c
    header = [f"# Baidu DeepBench, {SOURCE} @ {COMMIT}, training results, sheets "
              + "; ".join(f"'{s}' (precision {p})" for p, s in SHEETS.items()) + "."]
    header += [f"# gpu {gpu}: {path} (git blob {blob}); machine: {machine}"
               for gpu, (path, blob, machine) in FILES.items()]
    header.append("# Extracted by validation/deepbench_conv.py --extract; times in ms as the sheets print "
                  "them (mean of 300 calls); empty: N/A in the sheet.")
    DATA.mkdir(parents=True, exist_ok=True)
    for name, fields, rows, what in (
            ("gemm.csv", GEMM_FIELDS, gemms, "cuBLAS GEMMs (gemm_bench.cu): C[MxN] = op(A)[MxK] op(B)[KxN]"),
            ("conv.csv", CONV_FIELDS, convs,
             "cuDNN convolutions (conv_bench.cu): input N x C x H x W, K filters of R x S, output P (w) x Q (h); "
             "fwd_algo: the forward algorithm the sheet names")):
        with open(DATA / name, "w", newline="") as f:
            f.write("\n".join([*header, f"# {what}"]) + "\n")
            writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {DATA / name}: {len(rows)} rows")


def read_csv(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


# ---- derivation -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvPass:
    gpu: str
    precision: str
    app: str
    role: str  # forward | grad_input | grad_weight
    shape: str
    stride: int
    p: int
    q: int
    mnk: tuple[int, int, int]
    ms: float
    efficiency: float

    @property
    def key(self) -> str:
        unit = "tensor" if self.precision == "fp16" else "cuda"
        return conv_efficiency_class(self.stride, self.p * self.q, self.role, unit)


def gemm_bias(rows: Iterable[dict[str, str]], gpu_id: str, precision: str) -> tuple[float, int]:
    """Median measured / modelled time of the sheet's compute-bound GEMMs (and how many)."""
    gpu = load_gpu(gpu_id)
    profile = default_profile(gpu)
    ratios = []
    for g in rows:
        if g["gpu"] != gpu_id or g["precision"] != precision or float(g["ms"]) < MIN_MS:
            continue
        m, n, k = int(g["m"]), int(g["n"]), int(g["k"])
        if precision == "fp16" and (m % 8 or n % 8 or k % 8):
            continue
        est = estimate_gemm(m, n, k, dtype=precision, gpu=gpu, profile=profile)
        if est.model_compute_s < est.model_memory_s:
            continue
        ratios.append(float(g["ms"]) * 1e-3 / est.time_s)
    return statistics.median(ratios), len(ratios)


def _winograd(c: dict[str, int], role: str) -> float:
    """``passes/costs/matmul.winograd_fraction`` from the sheet's geometry (fp32 only)."""
    if role == "grad_weight" or (c["r"], c["s"]) != (3, 3) or c["stride_w"] != 1 or c["stride_h"] != 1:
        return 1.0
    tiles = -(-c["p"] // WINOGRAD_TILE) * -(-c["q"] // WINOGRAD_TILE)
    return min(1.0, WINOGRAD_MULTIPLIES_PER_TILE * tiles / (9 * c["p"] * c["q"]))


COLUMN = {"forward": "fwd_ms", "grad_input": "dgrad_ms", "grad_weight": "wgrad_ms"}


def conv_passes(rows: Iterable[dict[str, str]], gpu_id: str, precision: str, bias: float) -> list[ConvPass]:
    """Every usable convolution pass of one sheet with its efficiency (module docstring)."""
    gpu = load_gpu(gpu_id)
    profile = default_profile(gpu)
    out, seen = [], set()
    for row in rows:
        if row["gpu"] != gpu_id or row["precision"] != precision:
            continue
        c = {f: int(row[f]) for f in CONV_FIELDS[3:16]}
        if tuple(c.values()) in seen:
            continue  # the same problem listed under a second application: counted once
        seen.add(tuple(c.values()))
        if precision == "fp16" and (c["c"] % 8 or c["k"] % 8):
            continue  # DeepBench padded these; nnperf models the unpadded tensors as misaligned
        npq, rs = c["n"] * c["p"] * c["q"], c["r"] * c["s"]
        tensors = ITEMSIZE[precision] * (c["n"] * c["c"] * c["h"] * c["w"] + npq * c["k"] + c["k"] * c["c"] * rs)
        for role in CONV_PASSES:
            if not row[COLUMN[role]] or float(row[COLUMN[role]]) < MIN_MS:
                continue
            ms = float(row[COLUMN[role]])
            m, n, k = {"forward": (npq, c["k"], c["c"] * rs), "grad_input": (npq, c["c"], c["k"] * rs),
                       "grad_weight": (c["k"], c["c"] * rs, npq)}[role]
            est = estimate_gemm(m, n, k, dtype=precision, gpu=gpu, profile=profile)
            compute = est.model_compute_s * (_winograd(c, role) if precision == "fp32" else 1.0)
            if compute < profile.memory_time(gpu.memory_bandwidth, tensors):
                continue
            rest = ms * 1e-3 / bias - est.reduction_s - est.overhead_s
            shape = (f"{c['w']}x{c['h']} C{c['c']} N{c['n']} K{c['k']} {c['s']}x{c['r']}"
                     f"/{c['stride_w']}x{c['stride_h']} -> {c['p']}x{c['q']}")
            out.append(ConvPass(gpu_id, precision, row["app"], role, shape,
                                max(c["stride_w"], c["stride_h"]), c["p"], c["q"], (m, n, k), ms,
                                compute / rest))
    return out


def derive(precision: str = "fp16") -> tuple[dict[str, tuple[float, int]], list[ConvPass]]:
    """Per GPU, its GEMM bias (median, n), and every usable convolution pass of ``precision``."""
    gemms, convs = read_csv("gemm.csv"), read_csv("conv.csv")
    biases, passes = {}, []
    for gpu in FILES:
        biases[gpu] = gemm_bias(gemms, gpu, precision)
        passes += conv_passes(convs, gpu, precision, biases[gpu][0])
    return biases, passes


def class_medians(passes: Iterable[ConvPass]) -> dict[str, tuple[float, int]]:
    """Pooled (both GPUs) median efficiency and n of each class."""
    by: dict[str, list[float]] = {}
    for p in passes:
        by.setdefault(p.key, []).append(p.efficiency)
    return {k: (statistics.median(v), len(v)) for k, v in sorted(by.items())}


def _summary(values: list[float]) -> str:
    if len(values) < 2:
        return f"n={len(values):3d} median {statistics.median(values):.3f}"
    q = statistics.quantiles(values, n=4)
    return f"n={len(values):3d} median {statistics.median(values):.3f} quartiles {q[0]:.3f}..{q[2]:.3f}"


def report(precision: str, rows: bool) -> None:
    biases, passes = derive(precision)
    print(f"== {precision} ({SHEETS[precision]})")
    for gpu, (bias, n) in biases.items():
        print(f"  {gpu:10s} GEMM measured/model: median {bias:.3f} (n={n})")
    if rows:
        for p in passes:
            print(f"  {p.gpu:9s} {p.role:11s} {p.key:22s} {p.app[:12]:12s} {p.shape:40s} "
                  f"mnk={p.mnk} {p.ms:.3f} ms eff {p.efficiency:.3f}")
    keys = sorted({p.key for p in passes})
    for key in keys:
        mine = [p for p in passes if p.key == key]
        per_gpu = "  ".join(f"{gpu} {_summary([p.efficiency for p in mine if p.gpu == gpu])}"
                            for gpu in FILES if any(p.gpu == gpu for p in mine))
        print(f"  {key:22s} pooled {_summary([p.efficiency for p in mine])}   {per_gpu}")
        for role in CONV_PASSES:
            if key.endswith(("_large", "_core")) and any(p.role == role for p in mine):
                print(f"    {role:20s} {_summary([p.efficiency for p in mine if p.role == role])}")
    if precision == "fp16":  # the "other" classes split by why they are not stride1_large
        for name, keep in (("small outputs", lambda p: p.p * p.q < CONV_LARGE_POSITIONS),
                           ("strided, large outputs", lambda p: p.p * p.q >= CONV_LARGE_POSITIONS and p.stride > 1)):
            for role in CONV_PASSES:
                print(f"  ({name}) {role:12s} {_summary([p.efficiency for p in passes if keep(p) and p.role == role])}")
    for role in CONV_PASSES:
        print(f"  all {role:18s} pooled {_summary([p.efficiency for p in passes if p.role == role])}")
    print(f"  all                    pooled {_summary([p.efficiency for p in passes])}")
    print("  [default.conv_efficiency] in default_profile.toml: the pooled medians, to 2 decimals")
    for key, (value, n) in class_medians(passes).items():
        print(f'  {key} = {value:.2f}  # n={n}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extract", nargs=2, metavar=("V100_XLSX", "T4_XLSX"), type=Path,
                        help="re-extract the CSVs from DeepBench's results/train xlsx files")
    parser.add_argument("--rows", action="store_true", help="print every convolution pass used")
    args = parser.parse_args()
    if args.extract:
        extract(*args.extract)
        return
    for precision in ("fp16", "fp32"):
        report(precision, args.rows)


if __name__ == "__main__":
    main()
