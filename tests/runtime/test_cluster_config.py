import tomllib

import pytest

from dualpath.runtime.cluster import (
    ClusterConfigError,
    apply_settings,
    cluster_from_toml,
    dump_cluster,
    load_cluster,
)


def test_default_preset_is_one_prefill_two_decode_nodes_with_cnics_eight_times_the_snic():
    spec = load_cluster("local-1p2d")
    assert spec.node_ids() == [("p0", "prefill"), ("d0", "decode"), ("d1", "decode")]
    assert spec.cnic_bytes_per_s == pytest.approx(8 * spec.snic_bytes_per_s)


def test_unknown_key_and_unknown_preset_are_errors_that_name_the_problem():
    with pytest.raises(ClusterConfigError, match="unknown key 'snic'"):
        cluster_from_toml({"links": {"snic": 1}})
    with pytest.raises(ClusterConfigError, match="unknown cluster preset"):
        load_cluster("no-such-cluster")
    with pytest.raises(ClusterConfigError, match="mode"):
        apply_settings(load_cluster("local-1p2d"), ["mode=fast"])


def test_settings_parse_human_units_and_survive_the_file_the_nodes_read():
    spec = apply_settings(
        load_cluster("local-1p2d"), ["snic_bytes_per_s=8MB/s", "dram_buffer_bytes=64MiB", "seed=3"]
    )
    assert spec.snic_bytes_per_s == 8e6 and spec.dram_buffer_bytes == 64 * 2**20 and spec.seed == 3
    assert cluster_from_toml(tomllib.loads(dump_cluster(spec))) == spec
