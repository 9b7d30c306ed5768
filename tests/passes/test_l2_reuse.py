"""L2 reuse: a read finds in L2 what a recent kernel touched when the bytes touched since fit
in the GPU's measured reuse capacity; those reads leave the DRAM term of the op's time, and all
of its bytes still pass the L2 at the measured L2 bandwidth. The expected hits are counted by
hand from the chain below, not taken from nnperf's output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.errors import UsageError
from nnperf.hardware import default_profile, list_gpus, load_gpu
from nnperf.passes.l2_reuse import l2_read_hits
from nnperf.prediction import predict_analysis

N = 1 << 20  # fp32 elements of every tensor of the chain
S = 4 * N  # bytes of one


class Chain(nn.Module):
    """relu(x) -> r * 2 -> m + x: three elementwise kernels, each over S-byte tensors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.relu(x)
        m = r * 2
        return m + x


@pytest.fixture(scope="module")
def chain():
    return analyze(Chain(), torch.randn(N), train=False)


def _by_op(analysis) -> dict[str, int]:
    return {c.op: c.index for c in analysis.ops if c.op in ("aten.relu", "aten.mul", "aten.add")}


def test_hits_by_hand(chain):
    """Touches in order, each adding its bytes to the running total: relu reads x (S) and
    writes r (2S); mul reads r, last touched at 2S: distance 0 + S, and writes m (4S); add
    reads m (last touched at 4S: S), then x, last touched at S, now at 5S: 5S - S + S = 5S.
    So at 5S every read but relu's hits (x is new there), at 4.5S add's read of x misses,
    below S nothing fits."""
    idx = _by_op(chain)
    assert l2_read_hits(chain.ops, 5 * S) == {idx["aten.mul"]: S, idx["aten.add"]: 2 * S}
    assert l2_read_hits(chain.ops, 4.5 * S) == {idx["aten.mul"]: S, idx["aten.add"]: S}
    assert l2_read_hits(chain.ops, 0.9 * S) == {}


class Lists(nn.Module):
    """Two foreach ops in a row over the same 8 tensors (8S in all)."""

    def forward(self, *xs: torch.Tensor) -> list[torch.Tensor]:
        ys = torch._foreach_mul(list(xs), 2.0)
        return torch._foreach_add(ys, 1.0)


def test_a_list_pass_larger_than_the_cache_finds_nothing():
    """An LRU cache of 4S that saw the first foreach write 8S in order has lost the first
    tensors by the time the second reads them: each of its inputs is 8S - S (written after it)
    + the reads before it + S away, more than 4S. At 16S the whole list fits."""
    lists = analyze(Lists(), tuple(torch.randn(N) for _ in range(8)), train=False)
    second = next(c.index for c in lists.ops if c.op == "aten._foreach_add")
    assert l2_read_hits(lists.ops, 4 * S) == {}
    assert l2_read_hits(lists.ops, 16 * S) == {second: 8 * S}


class Halves(nn.Module):
    """Writes one half of a buffer no kernel touched before, then reads the other half."""

    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        buf[:N].copy_(x)
        return buf[N:] * 2


def test_writing_one_slice_does_not_make_the_rest_of_the_buffer_recent():
    halves = analyze(Halves(), (torch.randn(N), torch.randn(2 * N)), train=False)
    mul = next(c.index for c in halves.ops if c.op == "aten.mul")
    assert mul not in l2_read_hits(halves.ops, 100 * S)


def test_hits_leave_the_dram_term_and_pass_the_l2_at_its_bandwidth(chain):
    gpu = load_gpu("rtx-4090")
    assert gpu.l2_reuse_mb * 1e6 >= 4 * S  # every hit of the hand count above
    without = load_gpu("rtx-4090", overrides={"l2_reuse_mb": "0"})  # the what-if that turns it off
    profile = default_profile(gpu)
    with_l2 = {t.op: t for t in predict_analysis(chain, gpu, profile=profile).step.ops}
    plain = {t.op: t for t in predict_analysis(chain, without, profile=profile).step.ops}
    bw, l2_bw = gpu.memory_bandwidth, gpu.l2_bandwidth_gbs * 1e9
    # mul: reads r (hit), writes m; add: reads m and x (both hit), writes its output
    assert with_l2["aten.mul"].model_memory_s == pytest.approx(max(profile.memory_time(bw, S), 2 * S / l2_bw))
    assert with_l2["aten.add"].model_memory_s == pytest.approx(max(profile.memory_time(bw, S), 3 * S / l2_bw))
    assert plain["aten.add"].model_memory_s == pytest.approx(profile.memory_time(bw, 3 * S))
    # relu reads x, which no kernel touched before: the same time either way
    assert with_l2["aten.relu"].kernel_s == plain["aten.relu"].kernel_s


def test_a_gpu_without_an_l2_measurement_times_every_read_at_dram(chain):
    l4 = load_gpu("l4")
    assert l4.l2_reuse is None
    add = next(t for t in predict_analysis(chain, l4).step.ops if t.op == "aten.add")
    assert add.model_memory_s == pytest.approx(default_profile(l4).memory_time(l4.memory_bandwidth, 3 * S))
    assert add.memory_s == pytest.approx(3 * S / l4.memory_bandwidth)


def test_the_roofline_counts_dram_bytes(chain):
    """An op whose reads hit L2 moves fewer DRAM bytes: its roofline memory term says so, and
    its kernel time never beats that roofline."""
    gpu = load_gpu("rtx-4090")
    add = next(t for t in predict_analysis(chain, gpu).step.ops if t.op == "aten.add")
    assert add.memory_s == pytest.approx(S / gpu.memory_bandwidth)  # only its output goes to DRAM
    assert add.kernel_s >= add.memory_s


def test_every_catalog_l2_reuse_names_its_measurement_and_fits_in_the_l2():
    measured = [g for g in list_gpus() if g.l2_reuse]
    assert {"rtx-4090", "a100-80gb-sxm", "h100-pcie", "h200-sxm"} <= {g.id for g in measured}
    for g in measured:
        assert g.sources.get("l2"), g.id
        assert g.l2_reuse_mb <= g.l2_mb, g.id
        assert g.l2_bandwidth_gbs > g.memory_bandwidth_gbs, g.id  # an L2 slower than DRAM is a typo


def test_what_ifs_turn_it_off_and_keep_it_physical():
    off = load_gpu("rtx-4090", overrides={"l2_reuse_mb": "0"})
    assert off.l2_reuse is None
    with pytest.raises(UsageError, match="not above the DRAM bandwidth"):
        load_gpu("rtx-4090", overrides={"l2_bandwidth_gbs": "500"})
    with pytest.raises(UsageError, match="more than the L2"):
        load_gpu("rtx-4090", overrides={"l2_reuse_mb": "100"})
    with pytest.raises(UsageError, match="with --set l2_bandwidth_gbs=9000: l2_bandwidth_gbs needs its partner"):
        load_gpu("l4", overrides={"l2_bandwidth_gbs": "9000"})
    what_if = load_gpu("l4", overrides={"l2_bandwidth_gbs": "2000", "l2_reuse_mb": "40"})  # no source needed
    assert what_if.l2_reuse == (2000e9, 40e6)


def test_a_gpu_file_gives_both_l2_fields_with_their_source(tmp_path):
    base = ['name = "A"', 'vendor = "NVIDIA"', 'architecture = "Ampere"', "sm_count = 108",
            "boost_clock_mhz = 1410", "memory_gib = 80", 'memory_type = "HBM2e"', "memory_bandwidth_gbs = 2039",
            "l2_mb = 40"]
    tables = ["[peak_tflops.tensor]", "bf16 = 312", "[peak_tflops.cuda]", "fp32 = 19.5"]
    path = tmp_path / "a.toml"
    path.write_text("\n".join([*base, "l2_bandwidth_gbs = 5400", *tables]))
    with pytest.raises(UsageError, match="l2_bandwidth_gbs needs its partner"):
        load_gpu(None, gpu_file=path)
    path.write_text("\n".join([*base, "l2_bandwidth_gbs = 5400", "l2_reuse_mb = 26", *tables]))
    with pytest.raises(UsageError, match=r"need their measurement named in \[sources\] l2"):
        load_gpu(None, gpu_file=path)
    path.write_text("\n".join([*base, "l2_bandwidth_gbs = 5400", "l2_reuse_mb = 26", *tables, "[sources]",
                               'l2 = "a microbenchmark"']))
    assert load_gpu(None, gpu_file=path).l2_reuse == (5400e9, 26e6)
