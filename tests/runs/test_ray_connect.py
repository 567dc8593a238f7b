"""runs.ray_connect: an address where no Ray cluster listens is one line, and so is an address without
--executor ray (test_ray_executor.py and test_ray_cluster.py connect to real instances)."""

import pytest

from attnscale.cli import main


def test_an_address_where_no_cluster_listens_is_one_line(capsys, tmp_path):
    pytest.importorskip("ray", reason="Ray cannot be imported here: pip install 'attnscale[ray]'")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["sweep", "--widths", "8", "--quick", "--out", str(tmp_path)]
    assert main(args + ["--ray-address", f"127.0.0.1:{port}"]) == 2
    assert "add --executor ray" in capsys.readouterr().err
    assert main(args + ["--executor", "ray", "--ray-address", f"127.0.0.1:{port}"]) == 2
    assert "no Ray cluster answers there" in capsys.readouterr().err
