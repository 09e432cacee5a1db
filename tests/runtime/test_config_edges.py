"""Bad configuration fails at once with a message naming what to change (issue 20, rows 11-13)."""

import pytest

from dualpath.cli.main import main
from dualpath.config.coerce import ConfigError
from dualpath.config.loader import load_document
from dualpath.runtime.cluster import ClusterConfigError, apply_settings, load_cluster


def test_malformed_cluster_toml_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\nname = "x"\nmode = dualpath\n')
    with pytest.raises(ClusterConfigError, match=r"bad\.toml.*line 3"):
        load_cluster(str(bad))
    bad.write_bytes(b"[cluster]\nname = '\xff'\n")
    with pytest.raises(ClusterConfigError, match=r"bad\.toml.*UTF-8"):
        load_cluster(str(bad))


def test_malformed_preset_document_names_the_file_and_line(tmp_path):
    bad = tmp_path / "hw.toml"
    bad.write_text("name = 'h'\n\nsnic_bytes_per_s = = 3\n")
    with pytest.raises(ConfigError, match=r"hw\.toml.*line 3"):
        load_document("hardware", str(bad))


def test_bad_read_path_and_device_are_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--read-path", "bogus", "--port", "0"])
    assert exit_info.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
    spec = load_cluster("local-1p2d")
    with pytest.raises(ClusterConfigError, match="read_path 'bogus'"):
        apply_settings(spec, ["read_path=bogus"])
    with pytest.raises(ClusterConfigError, match="device 'banana'"):
        apply_settings(spec, ["device=banana"])
    assert apply_settings(spec, ["device=cuda:1", "read_path=split"]).device == "cuda:1"
