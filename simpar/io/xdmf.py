"""XDMF sidecar of a grid file (``PATH.xdmf``, ``path + ".xdmf"``) that ParaView opens.

Version 3.0 temporal collection with one grid per frame (reference/HDF5_FORMATS.md, section
3.1). Each grid is a ``3DCoRectMesh`` with ``ORIGIN_DXDYDZ`` (values in z, y, x order) when
the coordinates are uniformly spaced, else a ``3DRectMesh`` with ``VXVYVZ`` (x first).
2-D (and 1-D) grids are written as 3-D with extent 1 on the missing axes. Values are
**node-centred with the nodes at the cell centres**: ParaView's points sit at the
coordinates stored in the file, so the visible domain ends half a cell inside the
physical one. Every variable with all the spatial dims is an ``Attribute`` whose
HyperSlab selects frame k of the ``[T, ...]`` dataset; a variable of an ensemble run
(``[T, M, ...]``) is one ``Attribute`` per member, ``NAME_member<m>`` selecting frame k and
member m; profiles and time series are not in the sidecar. The HDF5 path is the file's basename, so the pair can be moved together.
The sidecar is rewritten after each flushed frame through a temporary file and
``os.replace``, so it never lists a frame that is not in the HDF5 file.

:class:`simpar.io.netcdf.GridWriter` owns one :class:`Sidecar` per file; nothing here opens
or writes the HDF5 file.
"""

from __future__ import annotations

import math
import time as _time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import h5py
import numpy as np

from simpar.io.files import remove_stale_temps, write_text_atomic
from simpar.io.nclayout import ENSEMBLE, TIME

__all__ = ["Sidecar", "frame_grid"]

_NT = "@NT@"  # placeholder for the frame count in cached XDMF text


def _fmt(x: float) -> str:
    # Python float repr: never "np.float64(...)" (that broke <Time Value> in tests).
    return repr(float(x))


def _number_type(dtype: np.dtype) -> tuple[str, int]:
    kind = {"f": "Float", "i": "Int", "u": "UInt"}.get(dtype.kind)
    if kind is None:
        raise ValueError(f"XDMF cannot describe dtype {dtype}")
    return kind, dtype.itemsize


def frame_grid(
    f: h5py.File,
    h5_name: str,
    coords: Mapping[str, np.ndarray],
    variables: Mapping[str, tuple[str, ...]],
    k: int,
    time: float,
    step: int,
) -> str:
    """The ``<Grid>`` element (XML text) of frame ``k``.

    Args:
      f: the open grid file (read for the variables' dtypes and shapes only).
      h5_name: the grid file's basename, as the sidecar refers to it.
      coords: spatial axes in C order (slowest first), 1-D float64 cell-centre coordinates.
      variables: variable name -> dims (``"time"`` first); only those with every spatial
        dim are described (with an ``"ensemble"`` dim after time: one per member).
      k: frame index (row of the ``[T, ...]`` datasets).
      time: simulation time of the frame.
      step: time-step index of the frame (names the grid ``step<step>``).

    Returns:
      The indented ``<Grid>`` text; the frame count is the placeholder ``@NT@`` until
      :meth:`Sidecar.write` fills it in.
    """
    names = list(coords)
    pad = 3 - len(names)
    shape = [1] * pad + [coords[a].size for a in names]  # z y x
    dims_txt = " ".join(map(str, shape))
    g = ET.Element("Grid", Name=f"step{int(step)}", GridType="Uniform")
    ET.SubElement(g, "Time", Value=_fmt(time))

    uniform, origin, spacing = True, [0.0] * pad, [1.0] * pad
    for a in names:
        c = coords[a]
        d = float(c[1] - c[0]) if c.size > 1 else 1.0
        if c.size > 2 and not np.allclose(np.diff(c), d, rtol=1e-6, atol=1e-12 * abs(d)):
            uniform = False
        origin.append(float(c[0]))
        spacing.append(d)
    if uniform:
        ET.SubElement(g, "Topology", TopologyType="3DCoRectMesh", Dimensions=dims_txt)
        geo = ET.SubElement(g, "Geometry", GeometryType="ORIGIN_DXDYDZ")
        for vals in (origin, spacing):  # z y x order, like Dimensions
            item = ET.SubElement(
                geo,
                "DataItem",
                Dimensions="3",
                NumberType="Float",
                Precision="8",
                Format="XML",
            )
            item.text = " ".join(_fmt(v) for v in vals)
    else:
        ET.SubElement(g, "Topology", TopologyType="3DRectMesh", Dimensions=dims_txt)
        geo = ET.SubElement(g, "Geometry", GeometryType="VXVYVZ")
        full = [None] * pad + names  # z y x
        for a in reversed(full):  # VXVYVZ lists x first
            if a is None:
                item = ET.SubElement(
                    geo,
                    "DataItem",
                    Dimensions="1",
                    NumberType="Float",
                    Precision="8",
                    Format="XML",
                )
                item.text = "0.0"
            else:
                item = ET.SubElement(
                    geo,
                    "DataItem",
                    Dimensions=str(coords[a].size),
                    NumberType="Float",
                    Precision="8",
                    Format="HDF",
                )
                item.text = f"{h5_name}:/{a}"

    full_dims = (TIME, *names)
    for name, dims in variables.items():
        if dims == full_dims:
            _attribute(g, f[name], h5_name, name, name, (k,), dims_txt)
        elif dims == (TIME, ENSEMBLE, *names):  # one Attribute per member: u_member0, ...
            for m in range(f[name].shape[1]):
                _attribute(g, f[name], h5_name, name, f"{name}_member{m}", (k, m), dims_txt)
        # profiles and time series have no place on the mesh
    ET.indent(g, space=" ", level=2)
    return "  " + ET.tostring(g, encoding="unicode")


def _attribute(g, ds, h5_name: str, name: str, label: str, lead: tuple, dims_txt: str) -> None:
    """Append an ``Attribute`` named ``label`` selecting ``ds[*lead, ...]`` (HyperSlab)."""
    kind, prec = _number_type(ds.dtype)
    att = ET.SubElement(g, "Attribute", Name=label, AttributeType="Scalar", Center="Node")
    slab = ET.SubElement(
        att,
        "DataItem",
        ItemType="HyperSlab",
        Dimensions=dims_txt,
        Type="HyperSlab",
    )
    rank = ds.ndim
    sel = ET.SubElement(slab, "DataItem", Dimensions=f"3 {rank}", Format="XML")
    start = [*lead] + [0] * (rank - len(lead))
    stride = [1] * rank
    count = [1] * len(lead) + list(ds.shape[len(lead) :])
    sel.text = "  ".join(" ".join(map(str, r)) for r in (start, stride, count))
    src = ET.SubElement(
        slab,
        "DataItem",
        # The frame count grows: filled in when the sidecar is written.
        Dimensions=" ".join(map(str, (_NT, *ds.shape[1:]))),
        NumberType=kind,
        Precision=str(prec),
        Format="HDF",
    )
    src.text = f"{h5_name}:/{name}"


class Sidecar:
    """The XDMF file of one grid file: one cached ``<Grid>`` per frame, rewritten whole.

    Args:
      path: the sidecar's path (``grid_path + ".xdmf"``); a temporary file left by a
        rewrite cut short by a kill is removed.
      min_interval: least wall-clock seconds between two rewrites by :meth:`add`
        (0: after every frame); :meth:`write` always rewrites.

    Attributes:
      frames: the ``<Grid>`` text of every frame listed, in order.
      dirty: a frame was added since the last rewrite.
    """

    def __init__(self, path: Path, min_interval: float = 0.0):
        self.path = Path(path)
        remove_stale_temps(self.path)
        self.min_interval = float(min_interval)
        self.last = -math.inf
        self.dirty = False
        self.frames: list[str] = []

    def add(self, grid: str, n_rows: int) -> None:
        """List one more frame (from :func:`frame_grid`); rewrite if ``min_interval`` passed.

        Args:
          grid: the frame's ``<Grid>`` text.
          n_rows: rows of the ``time`` dataset (the frame count of the HyperSlab sources).
        """
        self.frames.append(grid)
        self.dirty = True
        if _time.monotonic() - self.last >= self.min_interval:
            self.write(n_rows)

    def write(self, n_rows: int) -> None:
        """Rewrite the sidecar atomically (temporary file + ``os.replace``).

        Args:
          n_rows: rows of the ``time`` dataset (the frame count of the HyperSlab sources).
        """
        text = (
            '<?xml version="1.0" ?>\n'
            '<Xdmf Version="3.0">\n'
            "<Domain>\n"
            ' <Grid Name="TimeSeries" GridType="Collection" '
            'CollectionType="Temporal">\n'
            + "\n".join(self.frames).replace(_NT, str(n_rows))
            + ("\n" if self.frames else "")
            + " </Grid>\n</Domain>\n</Xdmf>\n"
        )
        write_text_atomic(self.path, text)
        self.last = _time.monotonic()
        self.dirty = False
