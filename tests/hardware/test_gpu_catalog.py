"""The GPU catalog: values checked against independent arithmetic, names, errors, user files."""

from __future__ import annotations

import math

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import list_gpus, load_gpu
from nnperf.hardware.names import normalize

REQUIRED_IDS = {
    "k80",
    "p100-sxm2",
    "v100-sxm2",
    "v100-pcie",
    "t4",
    "a10",
    "a100-40gb-sxm",
    "a100-80gb-sxm",
    "a100-40gb-pcie",
    "a100-80gb-pcie",
    "l4",
    "l40s",
    "rtx-3090",
    "rtx-4090",
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "b200",
    "mi250x",
    "mi300x",
}

# Dense fp16 tensor FLOP per clock per SM from the architecture whitepapers (reference/gpus.md):
# tensor peak = SMs x FLOP/clk/SM x clock. A 2:4-sparse figure would come out 2x too high.
FP16_FLOP_PER_CLK_PER_SM = {
    "v100-sxm2": 1024,
    "v100-pcie": 1024,
    "t4": 1024,
    "a10": 1024,
    "l4": 1024,
    "a100-40gb-sxm": 2048,
    "a100-80gb-sxm": 2048,
    "a100-40gb-pcie": 2048,
    "a100-80gb-pcie": 2048,
    "h100-sxm": 4096,
    "h100-pcie": 4096,
    "h200-sxm": 4096,
    "l40s": 1024,
    "mi300x": 2048,
    # GeForce parts: fp16 with fp32 accumulate (what PyTorch uses) runs at half rate
    # (GA102 / Ada whitepapers: RTX 3090 71 of 142, RTX 4090 165.2 of 330.3 TFLOP/s).
    "rtx-3090": 512,
    "rtx-4090": 512,
    # Blackwell doubles Hopper's per-SM rate: 2.25 PFLOP/s dense on 148 SMs.
    "b200": 8192,
    # CDNA2: 383 TFLOP/s per board = 220 CUs x 1024 FLOP/clk x 1.7 GHz.
    "mi250x": 1024,
}


def test_catalog_has_every_required_gpu_with_sources():
    gpus = {g.id: g for g in list_gpus()}
    assert set(gpus) >= REQUIRED_IDS
    for g in gpus.values():
        assert g.sources, g.id
        assert any("https://" in s for s in g.sources.values()), g.id
        assert g.confidence in {"datasheet", "unverified"}


@pytest.mark.parametrize("gpu_id,per_clk", sorted(FP16_FLOP_PER_CLK_PER_SM.items()))
def test_tensor_peaks_are_dense(gpu_id, per_clk):
    g = load_gpu(gpu_id)
    expected = g.sm_count * per_clk * g.tensor_clock_mhz * 1e6  # the datasheet figure
    assert g.tensor_tflops["fp16"] * 1e12 == pytest.approx(expected, rel=0.02)
    # what predictions use: scaled to a published sustained clock where there is one
    assert g.peak_flops("fp16") == pytest.approx(expected * (g.sustained_clock_mhz or g.tensor_clock_mhz)
                                                 / g.tensor_clock_mhz, rel=0.02)


def test_h100_sxm_headline_numbers():
    g = load_gpu("h100")
    assert g.tensor_tflops["bf16"] * 1e12 == pytest.approx(132 * 4096 * 1.83e9, rel=1e-3)  # 989.4 T
    assert g.memory_bandwidth == 3350e9
    assert g.cuda_tflops["fp32"] == 67
    # predictions run at the H200's sustained 1470 MHz (the same die at the same 700 W):
    # tensor peaks quoted at 1830 MHz, CUDA-core peaks at 1980
    assert g.peak_flops("bf16") == pytest.approx(132 * 4096 * 1.47e9, rel=1e-3)
    assert g.ridge_point("bf16") == pytest.approx(132 * 4096 * 1.47e9 / 3350e9, rel=1e-3)
    assert g.peak_flops("fp32", tensor_cores=False) == pytest.approx(67e12 * 1470 / 1980)


def test_the_500w_h100_sustains_the_700w_clock_scaled_by_its_power_law():
    h100, h500 = load_gpu("h100"), load_gpu("h100-sxm-96gb-500w")
    k = math.log(1830 / 1545) / math.log(700 / 400)  # the datasheets' clock against power (notes)
    assert h500.sustained_clock_mhz == pytest.approx(h100.sustained_clock_mhz * (500 / 700) ** k, abs=1)


# Dense = the datasheet's "with sparsity" figure / 2 (TFLOP/s, or TOPS for int8).
SPARSE_DATASHEET_FIGURES = [
    ("h100-sxm", "bf16", 1979),  # H100 datasheet, SXM column
    ("h100-pcie", "fp16", 1513),  # H100 datasheet, PCIe column
    ("h200-sxm", "fp8", 3958),  # H200 datasheet
    ("b200", "bf16", 4500),  # Blackwell datasheet, HGX B200 column: 4.5 PFLOPS*
    ("b200", "fp8", 9000),  # 9 PFLOPS*
    ("a100-80gb-sxm", "tf32", 312),  # A100 datasheet
    ("a10", "bf16", 250),  # A10 datasheet
    ("l4", "fp8", 485),  # L4 datasheet
    ("l40s", "fp8", 1466),  # L40S datasheet
    ("mi300x", "fp16", 2614.9),  # MI300X data sheet, "with structured sparsity"
]


@pytest.mark.parametrize("gpu_id,dtype,sparse_tflops", SPARSE_DATASHEET_FIGURES)
def test_tensor_peaks_are_half_the_sparse_datasheet_figure(gpu_id, dtype, sparse_tflops):
    assert load_gpu(gpu_id).tensor_tflops[dtype] == pytest.approx(sparse_tflops / 2, rel=2e-3)


# Total memory as the driver reports it (PyTorch total_memory, MiB) in public logs and, for the
# H200, on this workplace's machine (nvidia-smi 143771 MiB). GPU memory sizes are binary: the
# nominal "141 GB" of an H200 is about 141 GiB, and the driver reserves a little of it.
DRIVER_TOTAL_MIB = {
    "h100-sxm": 81090,
    "h100-pcie": 81008,
    "h200-sxm": 143156,
    "b200": 182631,
    "a100-80gb-pcie": 81049,
    "v100-sxm2": 16160,
    "rtx-4090": 24563,
}


@pytest.mark.parametrize("gpu_id,reported_mib", sorted(DRIVER_TOTAL_MIB.items()))
def test_memory_gib_is_the_nominal_size_in_binary_units(gpu_id, reported_mib):
    nominal_mib = load_gpu(gpu_id).memory_gib * 1024
    assert 0.97 * nominal_mib <= reported_mib <= nominal_mib


def test_h200_memory_is_not_decimal_gigabytes():
    g = load_gpu("h200")
    assert g.memory_gib == 141
    # Read as 141e9 bytes it would be 134,466 MiB, less than the 143,771 MiB nvidia-smi shows.
    assert 141e9 / 2**20 < 143771 <= g.memory_bytes / 2**20


def test_blackwell_and_h200_headline_numbers():
    b = load_gpu("b200")
    assert b.tensor_tflops["bf16"] == pytest.approx(36e3 / 8 / 2)  # HGX B200: 36 PFLOPS* for 8 GPUs
    assert b.memory_bandwidth == 7.7e12  # Blackwell datasheet, HGX B200 column
    assert b.memory_gib == 180 and b.sm_count == 148
    assert b.cuda_tflops["fp32"] == 75
    # ... at the 1856 MHz its tensor peak is quoted at; a long load holds ~1580 MHz at 1000 W
    assert b.peak_flops("bf16") == pytest.approx(36e15 / 8 / 2 * 1580 / 1856)
    h = load_gpu("h200")
    assert h.memory_bandwidth == 4.8e12
    assert h.tensor_tflops["bf16"] == load_gpu("h100").tensor_tflops["bf16"]  # same GH100 die
    # ... whose 700 W cap holds the H200's SM clock at 1470 MHz under sustained GEMMs
    assert h.peak_flops("bf16") == pytest.approx(989.4e12 * 1470 / 1830)
    assert h.l2_mb == 60


def test_multi_die_boards_are_described_per_die():
    mi = load_gpu("mi250x")  # board: 220 CUs, 383 TFLOP/s fp16, 128 GB, 3276.8 GB/s
    assert mi.sm_count * 2 == 220
    assert mi.tensor_tflops["fp16"] * 2 == pytest.approx(383)
    assert mi.memory_gib * 2 == 128
    assert mi.memory_bandwidth_gbs * 2 == pytest.approx(3276.8)
    k80 = load_gpu("k80")  # board: 2 x 13 SMs, 8.73 TFLOP/s fp32, 24 GB, 480 GB/s
    assert k80.sm_count * 2 == 26
    assert k80.cuda_tflops["fp32"] * 2 == pytest.approx(8.73, abs=0.02)
    assert k80.memory_gib * 2 == 24 and k80.memory_bandwidth_gbs * 2 == 480


def test_known_traps_from_the_reference():
    assert load_gpu("l4").sm_count == 58
    assert load_gpu("a10").memory_gib == 24
    assert load_gpu("h100").memory_bandwidth_gbs == 3350


@pytest.mark.parametrize(
    "query,gpu_id",
    [
        ("h100", "h100-sxm"),
        ("H100-SXM", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("h200", "h200-sxm"),
        ("a100", "a100-80gb-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2"),
        ("rtx4090", "rtx-4090"),
        ("MI300X", "mi300x"),
        ("  nvidia l4 ", "l4"),
        ("A100 80GB PCIe", "a100-80gb-pcie"),
    ],
)
def test_name_resolution(query, gpu_id):
    assert load_gpu(query).id == gpu_id


def test_every_spelling_names_one_gpu():
    owner: dict[str, str] = {}
    for g in list_gpus():
        for spelling in {normalize(s) for s in (g.id, g.name, *g.aliases)}:
            assert owner.setdefault(spelling, g.id) == g.id, spelling


def test_ambiguous_and_unknown_names_list_candidates():
    with pytest.raises(UsageError, match=r"ambiguous.*a100-40gb-pcie.*a100-80gb-pcie"):
        load_gpu("a100 pcie")
    with pytest.raises(UsageError, match=r"unknown GPU 'h1000'.*closest:.*h100"):
        load_gpu("h1000")


@pytest.mark.parametrize("query,closest", [("h20", "h200-sxm"), ("NVIDIA H20", "h200-sxm"),
                                           ("l40", "l40s"), ("b20", "b200")])
def test_a_word_cut_short_is_another_gpu(query, closest):
    """The H20 is not an H200, the L40 not an L40S: a prefix names a GPU only in whole words
    (the L40S's alias 'L40-S' does not make 'l40' one of its words)."""
    with pytest.raises(UsageError, match=rf"unknown GPU '{query}'; closest: {closest}"):
        load_gpu(query)


def test_missing_dtype_units_raise_or_fall_back_visibly():
    v100 = load_gpu("v100")
    with pytest.raises(UsageError, match=r"no .*bf16 units; valid dtypes: fp64, fp32, fp16"):
        v100.peak_flops("bf16")
    rate = v100.peak("bf16", fallback=True)
    assert rate.flops == 15.7e12 and rate.unit == "cuda" and "bf16" in rate.note
    with pytest.raises(UsageError, match="unknown dtype"):
        v100.peak_flops("fp12")


def test_math_unit_by_dtype_and_architecture():
    assert load_gpu("v100").math_unit("fp32") == "cuda"
    assert load_gpu("v100").math_unit("fp32", tf32=True) == "cuda"  # no TF32 before Ampere
    assert load_gpu("v100").math_unit("fp16") == "tensor"
    assert load_gpu("a100").math_unit("fp32") == "cuda"
    assert load_gpu("a100").math_unit("fp32", tf32=True) == "tensor"
    assert load_gpu("a100").matmul_peak("fp32", tf32=True).flops == 156e12
    assert load_gpu("mi300x").math_unit("fp32") == "tensor"  # fp32 matrix cores
    assert load_gpu("p100").math_unit("fp16") == "cuda"


def test_geforce_fp16_is_the_fp32_accumulate_rate():
    g = load_gpu("rtx 4090")
    assert g.tensor_tflops["fp16"] == pytest.approx(330.3 / 2, rel=1e-3)
    assert g.tensor_tflops["fp16_acc16"] == pytest.approx(330.3)


GOOD = """
name = "Lab GPU"
aliases = ["labby"]
vendor = "NVIDIA"
architecture = "Hopper"
compute_capability = "9.0"
sm_count = 100
boost_clock_mhz = 1800
memory_gib = 64
memory_type = "HBM3"
memory_bandwidth_gbs = 3000
[peak_tflops.tensor]
bf16 = 700
[peak_tflops.cuda]
fp32 = 50
"""


def test_user_gpu_file(tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(GOOD)
    g = load_gpu(None, gpu_file=path)
    assert g.id == "lab" and g.peak_flops("bf16") == 700e12
    assert load_gpu("labby", gpu_file=path).id == "lab"
    assert load_gpu("h100", gpu_file=path).id == "h100-sxm"


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda s: s.replace("sm_count = 100\n", ""), "sm_count"),
        (
            lambda s: s.replace("memory_bandwidth_gbs = 3000", "memory_bandwidth_gbs = -1"),
            "memory_bandwidth_gbs",
        ),
        (lambda s: s.replace("fp32 = 50", "fp32 = 0"), "peak_tflops.cuda.fp32"),
        (lambda s: s.replace("bf16 = 700", "bf17 = 700"), "peak_tflops.tensor.bf17"),
    ],
)
def test_bad_user_gpu_file_names_file_and_field(tmp_path, edit, field):
    path = tmp_path / "bad.toml"
    path.write_text(edit(GOOD))
    with pytest.raises(UsageError) as err:
        load_gpu(None, gpu_file=path)
    assert "bad.toml" in str(err.value) and field in str(err.value)


def test_missing_gpu_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_gpu(None, gpu_file=tmp_path / "nope.toml")


@pytest.mark.parametrize("gpu_id,reported_mib", sorted(DRIVER_TOTAL_MIB.items()))
def test_usable_memory_is_what_cuda_reports(gpu_id, reported_mib):
    assert load_gpu(gpu_id).usable_memory_bytes == reported_mib * 2**20


def test_usable_memory_without_a_reading_keeps_the_largest_reserve_seen():
    from nnperf.hardware.catalog import DRIVER_RESERVE

    largest = max(1 - mib / (load_gpu(g).memory_gib * 1024) for g, mib in DRIVER_TOTAL_MIB.items())
    assert largest <= DRIVER_RESERVE < largest + 0.005  # conservative, but only just
    a100 = load_gpu("a100-40gb")
    assert a100.cuda_total_mib is None
    assert a100.usable_memory_bytes == pytest.approx(40 * 2**30 * (1 - DRIVER_RESERVE))


def test_a_resized_what_if_does_not_keep_the_real_cards_reading():
    from nnperf.hardware.catalog import DRIVER_RESERVE

    resized = load_gpu("h100", overrides={"memory_gib": "40"})
    assert resized.usable_memory_bytes == pytest.approx(40 * 2**30 * (1 - DRIVER_RESERVE))
