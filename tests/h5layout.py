"""Print every group/dataset of an HDF5 file: name, shape, dtype and attributes (sorted)."""

import sys

import h5py
import numpy as np

SKIP = {"simpar_version", "jax_version"}


def show(v):
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        return repr(v[:60]) + (f"...({len(v)} chars)" if len(v) > 60 else "")
    if isinstance(v, h5py.Reference):
        return "<ref>"
    a = np.asarray(v)
    if a.dtype.kind == "O":
        return f"{a.dtype} {a.shape} {[str(x) for x in a.ravel()][:6]}"
    return f"{a.dtype} {a.shape} {np.array2string(a.ravel()[:6], precision=6)}"


def main(path):
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            kind = "D" if isinstance(obj, h5py.Dataset) else "G"
            extra = f" {obj.shape} {obj.dtype}" if kind == "D" else ""
            print(f"{kind} /{name}{extra}")
            for k in sorted(obj.attrs):
                if k in SKIP:
                    continue
                try:
                    print(f"    @{k} = {show(obj.attrs[k])}")
                except Exception as e:
                    print(f"    @{k} = <{type(e).__name__}>")

        print("G /")
        for k in sorted(f.attrs):
            if k not in SKIP:
                print(f"    @{k} = {show(f.attrs[k])}")
        f.visititems(visit)


if __name__ == "__main__":
    main(sys.argv[1])
