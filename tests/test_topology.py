"""Device grids: neighbour pairs, row/column groups, mesh parsing and the errors users see."""

import pytest

from simpar.errors import ConfigError
from simpar.parallel.topology import DeviceGrid, make_device_grid, parse_mesh


def test_shift_pairs_periodic_and_not():
    g = DeviceGrid((2, 4), (True, False))
    # along axis 1 (not periodic): 0->1, 1->2, 2->3 in each row, no wrap
    assert g.shift_pairs(1, +1) == [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)]
    assert g.shift_pairs(1, -1) == [(1, 0), (2, 1), (3, 2), (5, 4), (6, 5), (7, 6)]
    # along axis 0 (periodic, 2 devices): each sends to the other
    assert sorted(g.shift_pairs(0, +1)) == [
        (0, 4),
        (1, 5),
        (2, 6),
        (3, 7),
        (4, 0),
        (5, 1),
        (6, 2),
        (7, 3),
    ]
    assert g.axis_pairs(1, +1) == [(0, 1), (1, 2), (2, 3)]
    assert g.axis_pairs(0, -1) == [(0, 1), (1, 0)]


def test_groups_are_rows_and_columns():
    g = DeviceGrid((2, 4), (True, True))
    assert g.groups((0,)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g.groups((1,)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    g3 = DeviceGrid((2, 2, 2), (True,) * 3)
    assert g3.groups((0, 1)) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert g3.coords(5) == (1, 0, 1) and g3.index((1, 0, 1)) == 5


@pytest.mark.parametrize("text,shape", [("8", (8,)), ("2x4", (2, 4)), ("2X2x2", (2, 2, 2))])
def test_parse_mesh(text, shape):
    assert parse_mesh(text) == shape


@pytest.mark.parametrize("text", ["", "2x", "0x4", "a", "1x1x1x1"])
def test_parse_mesh_rejects(text):
    with pytest.raises(ConfigError, match="--mesh"):
        parse_mesh(text)


def test_mesh_must_divide_domain():
    with pytest.raises(ConfigError, match=r"grid shape 30x64 does not divide over device mesh 4x2"):
        make_device_grid((4, 2), (30, 64), (True, True), 1)
    with pytest.raises(ConfigError, match="more axes"):
        make_device_grid((2, 2, 2), (16, 16), (True, True), 1)
    with pytest.raises(ConfigError, match="halo width 3 exceeds the block size 2"):
        make_device_grid((8,), (16, 16), (True, True), 3)
    assert make_device_grid((8,), (16, 16), (True, False), 2).shape == (8, 1)
