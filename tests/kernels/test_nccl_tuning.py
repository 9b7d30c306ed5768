"""NCCL's tuning model (src/graph/tuning.cc, NCCL 2.30), worked by hand from its constants."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.hardware.cluster import load_cluster
from nnperf.kernels.collectives import estimate_collective
from nnperf.kernels.nccl_tuning import (
    Topology,
    candidates,
    choose,
    latency_us,
    nvls_tree_busbw,
    tree_busbw,
)

H100_NODES = dict(intra_link="nvlink", cpu="intel", generation="hopper")


def test_ring_latency_counts_hops_inside_and_between_nodes():
    """128 ranks on 16 nodes, all-gather: 127 hops, 15 of them between nodes. Once the ring
    leaves the node every hop costs at least the host's network post (1 us on Intel, x3 with
    Simple)."""
    topo = Topology(128, 16, **H100_NODES)
    assert latency_us("all_gather", "ring", "LL", topo) == pytest.approx(6.6 + 112 * 1.0 + 15 * 2.7)
    assert latency_us("all_gather", "ring", "LL128", topo) == pytest.approx(14.0 + 112 * 1.9 + 15 * 4.0)
    assert latency_us("all_gather", "ring", "Simple", topo) == pytest.approx(8.4 + 112 * 3.4 + 15 * 14.0)
    # all-reduce: twice the hops, 2 (nodes - 1) of them on the network
    assert latency_us("all_reduce", "ring", "Simple", topo) == pytest.approx(8.4 + 224 * 3.4 + 30 * 14.0)
    # one node: NVLink hops only, no network overhead
    assert latency_us("all_gather", "ring", "LL", Topology(8, 1, **H100_NODES)) == pytest.approx(6.6 + 7 * 0.6)


def test_amd_hosts_post_network_sends_slower():
    topo = Topology(16, 2, intra_link="nvlink", cpu="amd", generation="ampere")
    # intra hops: max(0.6, 2.0) for LL, max(3.4, 3 x 2.0) for Simple
    assert latency_us("all_gather", "ring", "LL", topo) == pytest.approx(6.6 + 14 * 2.0 + 1 * 2.7)
    assert latency_us("all_gather", "ring", "Simple", topo) == pytest.approx(8.4 + 14 * 6.0 + 1 * 14.0)


def test_tree_latency_is_logarithmic_in_nodes():
    topo = Topology(1024, 128, **H100_NODES)
    assert latency_us("all_reduce", "tree", "Simple", topo) == pytest.approx(8.4 + 2 * (7 * 4.0 + 7 * 14.0))
    assert latency_us("all_reduce", "tree", "LL", topo) == pytest.approx(6.8 + 2 * (7 * 0.6 + 7 * 5.0))


def test_one_gpu_per_node_uses_the_trees_network_latency_and_pat():
    topo = Topology(64, 64, **H100_NODES)
    assert latency_us("all_gather", "ring", "Simple", topo) == pytest.approx(8.4 + 63 * 14.0)
    assert latency_us("all_gather", "pat", "Simple", topo) == pytest.approx(8.0 + 6 * 14.0 / 3.5 + 64 * 2.8)
    assert ("pat", "Simple") in candidates("all_gather", topo)
    assert ("pat", "Simple") not in candidates("all_gather", Topology(128, 16, **H100_NODES))
    assert ("pat", "Simple") not in candidates("all_reduce", topo)


def test_the_fastest_choice_wins_by_size():
    """1 KiB all-gather on 128 ranks: LL's latency wins; 1 GiB: the bandwidth of LL128 (0.92 of
    Simple's 320 GB/s) against Simple's extra 312 us of hops."""
    topo = Topology(128, 16, **H100_NODES)
    busbw, factor = 320e9, 127 / 128
    small = choose("all_gather", 1024, factor, busbw, topo)
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    # LL: half the bus bandwidth, capped at 20.4 GB/s (llMaxBw: Intel hosts, more than 2 nodes)
    assert small.time_s == pytest.approx((6.6 + 112 + 40.5) * 1e-6 + 1024 * factor / 20.4e9)
    large = choose("all_gather", 2**30, factor, busbw, topo)
    ll128 = (14.0 + 112 * 1.9 + 60) * 1e-6 + 2**30 * factor / (0.92 * busbw)
    simple = (8.4 + 112 * 3.4 + 210) * 1e-6 + 2**30 * factor / busbw
    assert large.time_s == pytest.approx(min(ll128, simple))
    assert large.protocol == ("LL128" if ll128 < simple else "Simple")


def test_large_all_reduce_across_many_nodes_takes_the_tree():
    """1 GiB over 128 nodes of 8: the tree (0.92 of the bandwidth, algorithm bandwidth half of
    it) against the ring's 2x1023 hops with the multi-node plateau (x1.4)."""
    topo = Topology(1024, 128, **H100_NODES)
    busbw = 320e9
    ring = 1.4 * (8.4 + (2046 - 254) * 3.4 + 254 * 14.0) * 1e-6 + 2**30 * 2 * 1023 / 1024 / busbw
    tree = (8.4 + 2 * (7 * 4.0 + 7 * 14.0)) * 1e-6 + 2**30 * 2 / (0.92 * busbw)
    tree_ll128 = (14.0 + 2 * (7 * 1.25 + 7 * 8.5)) * 1e-6 + 2**30 * 2 / (0.92 * 120 / 128 * busbw)
    got = choose("all_reduce", 2**30, 2 * 1023 / 1024, busbw, topo)
    assert tree < min(ring, tree_ll128)
    assert (got.algorithm, got.protocol) == ("tree", "Simple")
    assert got.time_s == pytest.approx(tree)


def test_the_tree_bandwidth_is_corrected_for_medium_sizes():
    """NCCL's treeCorrectionFactor: 1 MiB is log2(2^20 / 64) = 14, Simple's factor there 0.5."""
    topo = Topology(16, 2, **H100_NODES)
    busbw = 320e9
    assert tree_busbw("Simple", busbw, topo, 2**20) == pytest.approx(0.92 * busbw * 0.5)
    assert tree_busbw("Simple", busbw, topo, 2**30) == pytest.approx(0.92 * busbw)  # past 256 MiB: 1
    # LL: a 3.8th of it, at most llMaxBw (Intel hosts, 2 nodes: 39 GB/s); 1 KiB: log2(16) = 4, 0.9
    assert tree_busbw("LL", busbw, topo, 2**10) == pytest.approx(min(0.92 * busbw / 3.8, 39e9) * 0.9)


def test_pcie_nodes_run_no_ll128():
    topo = Topology(8, 1, intra_link="pcie", cpu="intel", generation="ampere")
    assert all(p != "LL128" for _, p in candidates("all_reduce", topo))
    assert latency_us("all_gather", "ring", "Simple", topo) == pytest.approx(8.4 + 7 * 5.7)


def test_a_large_group_pays_milliseconds_a_small_one_microseconds():
    """The model's point for a 1024-GPU plan: a ring all-gather's latency grows with its hops."""
    cluster = load_cluster("dgx-h100")
    small = estimate_collective("all_gather", 2**26, tuple(range(8)), cluster)
    large = estimate_collective("all_gather", 2**26, tuple(range(1024)), cluster)
    assert small.latency_s < 50e-6
    assert large.latency_s > 1e-3


def test_cluster_files_say_the_host_and_the_link(tmp_path):
    assert load_cluster("dgx-a100").host_cpu == "amd"
    assert load_cluster("dgx-h100").host_cpu == "intel" and load_cluster("dgx-h100").intra.link == "nvlink"
    assert load_cluster("dgx-h100").generation == "hopper"
    path = tmp_path / "mine.toml"
    body = ('name = "x"\ngpu = "h100-sxm"\ngpus_per_node = 8\nhost_cpu = "{cpu}"\n[intra]\nlink_gbs = 64\n'
            'efficiency = 0.8\nlatency_us = 5\nlink = "{link}"\n[inter]\nlink_gbs = 25\nefficiency = 0.8\n'
            'latency_us = 20\n')
    path.write_text(body.format(cpu="amd", link="pcie"))
    mine = load_cluster(str(path))
    assert mine.host_cpu == "amd" and mine.intra.link == "pcie"
    path.write_text(body.format(cpu="arm", link="pcie"))
    with pytest.raises(UsageError, match=r"host_cpu.*intel, amd"):
        load_cluster(str(path))
    path.write_text(body.format(cpu="intel", link="infinityfabric"))
    with pytest.raises(UsageError, match=r"intra\.link.*nvlink, pcie"):
        load_cluster(str(path))
    assert load_cluster("dgx-h100").intra.nvls_busbw == 480e9 and load_cluster("dgx-a100").intra.nvls_busbw == 0
    path.write_text(body.format(cpu="intel", link="nvlink").replace('link = "nvlink"\n', 'link = "nvlink"\nnvls_busbw_gbs = "fast"\n'))
    with pytest.raises(UsageError, match=r"intra\.nvls_busbw_gbs.*GB/s"):
        load_cluster(str(path))


def test_nvls_only_for_all_reduce_inside_one_node_that_has_it():
    with_nvls = Topology(8, 1, nvls_busbw=480e9, **H100_NODES)
    assert ("nvls", "Simple") in candidates("all_reduce", with_nvls)
    assert ("nvls", "Simple") not in candidates("all_gather", with_nvls)
    assert ("nvls", "Simple") not in candidates("all_reduce", Topology(8, 1, **H100_NODES))
    assert ("nvls", "Simple") not in candidates("all_reduce", Topology(16, 2, nvls_busbw=480e9, **H100_NODES))
    assert latency_us("all_reduce", "nvls", "Simple", with_nvls) == 25.0
    # small messages still take the LL ring (15 us), large ones NVLS
    assert choose("all_reduce", 1024, 14 / 8, 369e9, with_nvls).algorithm == "ring"
    large = choose("all_reduce", 2**30, 14 / 8, 369e9, with_nvls)
    assert large.algorithm == "nvls" and large.time_s == pytest.approx(25e-6 + 2**30 * 14 / 8 / 480e9)


def test_nvls_tree_joins_nvswitch_nodes_for_all_reduce():
    """NCCL's NVLS tree (tuning.cc): all-reduce only, Simple only, on more than one node with
    NVLS. Latency 25 us inside the node plus 20.9 us per tree level up and down; bus bandwidth
    the least of NVLS's (480 GB/s), the network's (twice it on two nodes) and 16 channels x
    57.7 GB/s (2 nodes) or x 45.5 GB/s (more)."""
    two = Topology(16, 2, nvls_busbw=480e9, **H100_NODES)
    four = Topology(32, 4, nvls_busbw=480e9, **H100_NODES)
    assert ("nvls_tree", "Simple") in candidates("all_reduce", two)
    assert ("nvls_tree", "Simple") not in candidates("reduce_scatter", two)
    assert ("nvls_tree", "Simple") not in candidates("all_reduce", Topology(8, 1, nvls_busbw=480e9, **H100_NODES))
    assert ("nvls_tree", "Simple") not in candidates("all_reduce", Topology(16, 2, **H100_NODES))
    assert latency_us("all_reduce", "nvls_tree", "Simple", two) == pytest.approx(25 + 2 * 1 * 20.9)
    assert latency_us("all_reduce", "nvls_tree", "Simple", four) == pytest.approx(25 + 2 * 2 * 20.9)
    bus = 2 * 15 / 16  # a ring all-reduce's bytes per byte on 16 ranks
    # two nodes on a 200 GB/s network: 2 x 200 = 400 < 480; 4 nodes: the network's 200
    big = choose("all_reduce", 2**33, bus, 200e9, two)
    assert big.algorithm == "nvls_tree" and big.time_s == pytest.approx((25 + 41.8) * 1e-6 + 2**33 * bus / 400e9)
    assert choose("all_reduce", 2**33, 2 * 31 / 32, 200e9, four).time_s == pytest.approx(
        108.6e-6 + 2**33 * (2 * 31 / 32) / 200e9)
    # a fast network: NVLS inside the node binds on two nodes; on four, with NVLS at 900 GB/s,
    # the per-channel cap: 16 x 45.5 = 728 GB/s
    assert choose("all_reduce", 2**33, bus, 400e9, two).time_s == pytest.approx(66.8e-6 + 2**33 * bus / 480e9)
    assert nvls_tree_busbw(900e9, Topology(32, 4, nvls_busbw=900e9, **H100_NODES)) == pytest.approx(728e9)
