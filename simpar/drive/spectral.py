"""``spectral_ns`` (pseudo-spectral 2-D incompressible flow) in the driver.

:func:`plan` reads the model's config (``[grid] shape, length, dtype``; ``[physics]
viscosity, drag, scheme``; ``[forcing] kind, amplitude, wavenumber``; ``[initial] kind`` and
its keys; ``time.dt``; ``output.fields``), builds the initial vorticity on the host, checks
the time step against the advective CFL limit (and, for ``rk4``, the viscous one) and the mesh
against the FFT's transposes. The shared options (engine, mesh, steps, ``output.every``, path,
checkpoint) come from ``simpar.drive.loop.read_options``. :class:`SpectralRun` maps the
physics of ``simpar.grid.spectral_ns`` over the devices with
``simpar.parallel.spectral_engine.SpectralEngine``.

**State** on the devices: the vorticity's Fourier coefficients ``omega_hat`` (complex, in the
plan's Fourier layout). **Output** (``simpar.io.netcdf.GridWriter``, netCDF4/HDF5 + XDMF
sidecar): ``vorticity``, ``u``, ``v`` as ``(time, y, x)`` at the grid points ``x_i = i L_x /
N_x`` (where the spectral solution is sampled), and the diagnostics ``energy``,
``enstrophy``, ``max_speed``, ``cfl`` as ``(time,)`` and the shell-summed energy spectrum
``spectrum(time, k)`` with the coordinate ``k`` (shell centres, 1/m).

**Checkpoints** hold the Fourier state itself, so ``--resume`` continues bit for bit on the
same engine: ``vorticity_hat_re`` and ``vorticity_hat_im``, float ``(N_x, N_y // 2 + 1)``, the
real and imaginary parts of ``rfft2(omega)`` (unnormalised, 2/3-truncated; without the
per-mesh zero padding of the half axis, so a checkpoint also resumes on another engine or
mesh, then equal to round-off).

Units are SI (``m``, ``s``; any consistent set works: the experiments use a ``2 pi`` box).
"""

from __future__ import annotations

import math

import numpy as np

from simpar import precision
from simpar.config import Section
from simpar.drive.loop import Options, Plan, Run, device_mesh, read_options
from simpar.errors import ConfigError
from simpar.grid import spectral_ns as S
from simpar.io.netcdf import GridWriter
from simpar.parallel.spectral_engine import FOURIER, REAL, Layout, SpectralEngine

CFL_LIMIT = 1.0
"""Largest ``dt (max|u| / dx + max|v| / dy)`` of the initial field accepted (RK4's advective
limit on the 2/3-truncated spectrum is about 1.35; the margin leaves room for the flow to
speed up)."""
RK4_VISCOUS_LIMIT = 2.78
"""Largest ``nu |k_max|^2 dt`` for the classical ``rk4`` scheme (``ifrk4`` has no limit)."""

FIELDS = ("vorticity", "velocity")
_UNITS = {
    "vorticity": ("s-1", "vorticity (z component)"),
    "u": ("m s-1", "velocity x component"),
    "v": ("m s-1", "velocity y component"),
    "energy": ("m2 s-2", "kinetic energy per unit mass, domain mean"),
    "enstrophy": ("s-2", "enstrophy (half the mean squared vorticity)"),
    "max_speed": ("m s-1", "largest speed on the grid"),
    "cfl": ("1", "advective CFL number dt (max|u|/dx + max|v|/dy)"),
    "spectrum": ("m2 s-2", "kinetic energy in the wavenumber shell"),
}
_STATE = ("vorticity_hat_re", "vorticity_hat_im")
VELOCITY = Layout(False, 1)  # (2, *grid): u, v in the real-space layout


def _check_path(path, key) -> None:
    if path.suffix in (".xdmf", ".toml"):
        raise ConfigError(
            key, f"{path} looks like a sidecar/config; give an HDF5 path such as run.nc or run.h5"
        )


def _initial(cfg: Section, shape, length, dtype) -> tuple[np.ndarray, int | None]:
    """The initial vorticity ``(N_x, N_y)`` (host, ``dtype``, 1/s) and the seed (or None)."""
    ini = cfg.section("initial")
    kind = ini.get("kind", "taylor_green", kind=str, choices=("taylor_green", "random"))
    if kind == "taylor_green":
        n = ini.get("wavenumber", 1, kind=int, min=1)
        if 3 * n >= min(shape):
            raise ConfigError(
                ini.key("wavenumber"),
                f"{n} is cut by the 2/3 rule on grid {shape}; need 3 * wavenumber < {min(shape)}",
            )
        amp = ini.get("amplitude", 1.0)
        return S.taylor_green(shape, length, wavenumber=n, amplitude=amp, dtype=dtype), None
    seed = ini.get("seed", 0, kind=int, min=0)
    peak = ini.get("peak_wavenumber", 4.0, min=0.0, exclusive_min=True)
    energy = ini.get("energy", 0.5, min=0.0, exclusive_min=True)
    w = S.random_turbulence(shape, length, seed=seed, peak_wavenumber=peak, energy=energy)
    return w.astype(dtype), seed


def _host_cfl(w: np.ndarray, length, dt: float) -> float:
    """``dt (max|u| / dx + max|v| / dy)`` of a host vorticity field (NumPy FFTs)."""
    n0, n1 = w.shape
    kx = 2 * math.pi * np.fft.fftfreq(n0, 1.0 / n0)[:, None] / length[0]
    ky = 2 * math.pi * np.fft.rfftfreq(n1, 1.0 / n1)[None, :] / length[1]
    k2 = kx * kx + ky * ky
    psi = np.fft.rfft2(w.astype(np.float64)) / np.where(k2 == 0, 1, k2)
    u = np.fft.irfft2(1j * ky * psi, s=(n0, n1))
    v = np.fft.irfft2(-1j * kx * psi, s=(n0, n1))
    return dt * (np.abs(u).max() * n0 / length[0] + np.abs(v).max() * n1 / length[1])


class SpectralPlan(Plan):
    """A validated ``spectral_ns`` run (initial field on the host; nothing on the devices).

    Attributes:
      common: the shared options; model, engine, mesh, dtype: for the metadata and summary.
      shape, length: the grid ``(N_x, N_y)`` (cells) and box ``(L_x, L_y)`` (m).
      w0: initial vorticity, host ``(N_x, N_y)`` of ``dtype``, 1/s.
      nu, drag, dt, scheme, forcing: the physics (``spectral_ns.make_params``).
      fields: output fields (``vorticity``, ``velocity``).
      eng: the ``SpectralEngine`` (mesh checked against the transposes).
    """

    first_step = 0

    def __init__(self, cfg: Section, opts: Options, config_text: str):
        cfg.section("model", required=True).get("name", kind=str, choices=("spectral_ns",))
        g = cfg.section("grid", required=True)
        self.shape = tuple(g.get("shape", kind=int, length=(2, 3), min=2))
        if len(self.shape) == 3:
            raise ConfigError(
                g.key("shape"),
                "spectral_ns runs 2-D grids in the driver; the 3-D velocity form "
                "(simpar.grid.spectral_ns3d) is available from Python only",
            )
        self.length = tuple(
            g.get("length", [2 * math.pi] * 2, length=2, min=0.0, exclusive_min=True)
        )
        self.dtype = g.get("dtype", "float32", kind=str, choices=("float32", "float64"))
        precision.require(self.dtype, g.key("dtype"))
        ph = cfg.section("physics")
        self.nu = ph.get("viscosity", min=0.0)
        self.drag = ph.get("drag", 0.0, min=0.0)
        self.scheme = ph.get("scheme", "ifrk4", kind=str, choices=S.SCHEMES)
        fo = cfg.section("forcing")
        kind = fo.get("kind", "none", kind=str, choices=("none", "kolmogorov"))
        amp = fo.get("amplitude", 1.0) if kind == "kolmogorov" else 0.0
        n_f = fo.get("wavenumber", 4, kind=int, min=1) if kind == "kolmogorov" else 4
        if kind == "kolmogorov" and 3 * n_f >= self.shape[1]:
            raise ConfigError(
                fo.key("wavenumber"),
                f"{n_f} is cut by the 2/3 rule; need 3 * wavenumber < grid.shape[1] = "
                f"{self.shape[1]}",
            )
        self.forcing = (amp, n_f)
        self.w0, self.seed = _initial(cfg, self.shape, self.length, np.dtype(self.dtype))
        t = cfg.section("time")
        self.dt = t.get("dt", min=0.0, exclusive_min=True)
        o = cfg.section("output")
        fields = o.get("fields", list(FIELDS), kind=str, length=(1, 2), choices=FIELDS)
        if len(set(fields)) != len(fields):
            raise ConfigError(o.key("fields"), f"lists a field twice: {fields}")
        self.fields = tuple(fields)
        self.common = c = read_options(
            cfg, opts, default_path="data/runs/spectral_ns.nc", check_path=_check_path
        )
        self._check_dt(t.key("dt"))
        self.model, self.engine = "spectral_ns", c.engine
        self.config_text = config_text
        self.save_checkpoints = c.checkpoint
        self.ck = None
        mesh = device_mesh(c)
        self.eng = SpectralEngine(c.engine, self.shape, mesh, real=True, key=c.mesh_key)
        self.mesh = tuple(self.eng.plan.mesh)

    def _check_dt(self, key: str) -> None:
        cfl = _host_cfl(self.w0, self.length, self.dt)
        if not cfl <= CFL_LIMIT:
            raise ConfigError(
                key,
                f"dt = {self.dt:g} gives an advective CFL number of {cfl:.3g} for the initial "
                f"field (dt (max|u|/dx + max|v|/dy)); the limit is {CFL_LIMIT}: use dt <= "
                f"{self.dt * CFL_LIMIT / cfl:.3g}",
            )
        if self.scheme == "rk4":
            kmax2 = sum(
                (2 * math.pi * ((n - 1) // 3) / L) ** 2
                for n, L in zip(self.shape, self.length, strict=True)
            )
            r = self.nu * kmax2 * self.dt
            if r > RK4_VISCOUS_LIMIT:
                raise ConfigError(
                    key,
                    f"dt = {self.dt:g} is beyond the viscous limit of the rk4 scheme "
                    f"(nu |k_max|^2 dt = {r:.3g} > {RK4_VISCOUS_LIMIT}); use dt <= "
                    f'{self.dt * RK4_VISCOUS_LIMIT / r:.3g} or physics.scheme = "ifrk4"',
                )

    def params(self) -> S.Params:
        """The physics as ``spectral_ns.Params`` (0-d leaves of ``dtype``)."""
        amp, n_f = self.forcing
        return S.make_params(
            self.nu, self.dt, self.length, drag=self.drag, forcing_amplitude=amp,
            forcing_wavenumber=n_f, dtype=np.dtype(self.dtype),
        )  # fmt: skip

    def state_shape(self) -> tuple[int, int]:
        """Shape of the checkpointed Fourier state ``(N_x, N_y // 2 + 1)``."""
        return (self.shape[0], self.shape[1] // 2 + 1)

    def check_resume(self, ck: dict, ck_step: int) -> int:
        """Check the checkpoint's Fourier state against the grid; the run starts at step 0."""
        for name in _STATE:
            a = ck.get(name)
            if a is None or a.shape != self.state_shape() or a.dtype != np.dtype(self.dtype):
                got = None if a is None else f"{a.shape} {a.dtype}"
                raise ConfigError(
                    "--resume",
                    f"the checkpoint's {name} is {got}, expected {self.state_shape()} "
                    f"{self.dtype}; it was not written by this spectral_ns config",
                )
        self.ck = ck
        return 0

    def build(self, ck) -> SpectralRun:
        """Place the state on the devices and compile the programs."""
        return SpectralRun(self)


class SpectralRun(Run):
    """A ``spectral_ns`` run on its engine (see ``simpar.drive.loop.Run`` for the methods)."""

    def __init__(self, plan: SpectralPlan):
        import jax.numpy as jnp

        self.plan, eng = plan, plan.eng
        self.eng = eng
        ops, comm = eng.ops, eng.comm
        scheme = plan.scheme
        self.desc = f"spectral_ns/{plan.engine}"
        self.params = plan.params()

        def observe(w_hat, p):
            d = S.diagnostics(w_hat, p, ops, comm)
            bad = jnp.sum(~jnp.isfinite(w_hat)).astype(jnp.int32)
            d["nonfinite"] = bad if comm is None else comm.psum(bad)
            return d

        def fields(w_hat, p):
            return S.to_physical(w_hat, ops), S.velocity(w_hat, p, ops)

        self._observe = eng.map(observe, (FOURIER, None), None)
        self._fields = eng.map(fields, (FOURIER, None), (REAL, VELOCITY))
        self._advance = eng.map(
            lambda w, p, n: S.advance(w, p, ops, n, scheme), (FOURIER, None, None), FOURIER,
            donate=True,
        )  # fmt: skip
        if plan.ck is None:
            to_state = eng.map(lambda w: S.to_state(w, ops), (REAL,), FOURIER)
            self.state = to_state(eng.place(plan.w0, REAL))
        else:
            ck = plan.ck
            w = (ck[_STATE[0]] + 1j * ck[_STATE[1]]).astype(np.result_type(plan.dtype, 1j))
            pad = eng.plan.fourier_shape[-1] - w.shape[-1]
            self.state = eng.place(np.pad(w, [(0, 0), (0, pad)]), FOURIER)

    def observe(self) -> dict:
        d = self._observe(self.state, self.params)
        return {k: self.eng.gather(v, None) for k, v in d.items()}

    def initial_problem(self, obs) -> None:
        if int(obs["nonfinite"]) > 0:
            raise ConfigError(
                "initial", f"the initial state has {int(obs['nonfinite'])} non-finite values"
            )

    def advance(self, n: int, last_good: str) -> None:
        import jax.numpy as jnp

        self.state = self._advance(self.state, self.params, jnp.asarray(n, jnp.int32))

    def problem(self, obs, step):
        bad = int(obs["nonfinite"])
        if bad == 0:
            return None
        return (
            f"{bad} non-finite Fourier coefficients of the vorticity after step {step} "
            f"(time.dt = {self.plan.dt:g}, physics.viscosity = {self.plan.nu:g})",
            "The flow outran the time step: reduce time.dt (keep the CFL number written in the "
            "output below about 1) or raise physics.viscosity",
        )

    def postfix(self, obs) -> dict:
        return {"E": f"{float(obs['energy']):.4g}", "CFL": f"{float(obs['cfl']):.2f}"}

    def snapshot(self):
        w, uv = self._fields(self.state, self.params)
        w_hat = self.eng.gather(self.state, FOURIER)[:, : self.plan.state_shape()[1]]
        return {
            "vorticity": self.eng.gather(w, REAL),
            "velocity": self.eng.gather(uv, VELOCITY),
            "w_hat": w_hat,
        }

    def checkpoint_state(self, snap, step) -> dict:
        w = snap["w_hat"]
        return {_STATE[0]: np.ascontiguousarray(w.real), _STATE[1]: np.ascontiguousarray(w.imag)}

    def _values(self, snap, obs) -> dict:
        out = {}
        if "vorticity" in self.plan.fields:
            out["vorticity"] = np.transpose(snap["vorticity"])
        if "velocity" in self.plan.fields:
            out["u"] = np.transpose(snap["velocity"][0])
            out["v"] = np.transpose(snap["velocity"][1])
        out.update({k: v for k, v in obs.items() if k != "nonfinite"})
        return out

    def open_writer(self, path, *, resume_step, overwrite, key):
        from simpar.io.meta import run_metadata

        if resume_step is not None:
            return SpectrumWriter.open_existing(path, step=resume_step, xdmf_min_interval=2.0)
        p = self.plan
        step_coord = {"coordinates": "step"}
        variables = {}
        for f in self._values_names():
            units, long_name = _UNITS[f]
            variables[f] = {
                "dims": ("time", "y", "x"), "dtype": p.dtype, "units": units,
                "long_name": long_name, "attrs": step_coord,
            }  # fmt: skip
        for f in ("energy", "enstrophy", "max_speed", "cfl"):
            units, long_name = _UNITS[f]
            variables[f] = {
                "dims": ("time",), "dtype": "float64", "units": units, "long_name": long_name,
                "attrs": step_coord,
            }  # fmt: skip
        attrs = run_metadata(
            p.config_text, engine=p.engine, mesh=p.mesh, dtype=p.dtype, seed=p.seed,
            model=p.model,
        )  # fmt: skip
        attrs.update(
            {
                "dt": float(p.dt),
                "viscosity": float(p.nu),
                "scheme": p.scheme,
                "grid_shape": np.asarray(p.shape, np.int32),
                "grid_length": np.asarray(p.length, np.float64),
                "state": "vorticity_hat (Fourier, 2/3 rule); checkpoints hold rfft2 re/im",
            }
        )
        coords = {
            "y": np.arange(p.shape[1]) * (p.length[1] / p.shape[1]),
            "x": np.arange(p.shape[0]) * (p.length[0] / p.shape[0]),
        }
        k = S.shell_wavenumbers(self.eng.ops, p.length)
        units, long_name = _UNITS["spectrum"]
        return SpectrumWriter.create(
            path, k=k, spectrum={"units": units, "long_name": long_name, "attrs": step_coord},
            coords=coords, variables=variables, attrs=attrs, overwrite=overwrite,
            xdmf_min_interval=2.0, time_units="s", length_units="m", key=key,
        )  # fmt: skip

    def _values_names(self) -> tuple[str, ...]:
        f = self.plan.fields
        return (("vorticity",) if "vorticity" in f else ()) + (
            ("u", "v") if "velocity" in f else ()
        )

    def write_frame(self, writer, step, snap, obs) -> None:
        writer.append(step * self.plan.dt, step, self._values(snap, obs))

    def summary(self, obs0, obs, steps_run, wall) -> dict:
        p = self.plan
        cells = math.prod(p.shape)
        scalars = lambda o: {k: float(v) for k, v in o.items() if np.ndim(v) == 0}  # noqa: E731
        return dict(
            rate=cells * steps_run / wall / 1e6 if wall > 0 else float("nan"),
            rate_unit="Mcell_updates/s",
            initial=scalars(obs0),
            final=scalars(obs),
            details={
                "cells": cells,
                "dt": float(p.dt),
                "viscosity": float(p.nu),
                "scheme": p.scheme,
                "fft_transposes_per_transform": p.eng.plan.n_transposes,
            },
        )


class SpectrumWriter(GridWriter):
    """``GridWriter`` plus the energy spectrum ``spectrum(time, k)`` with a ``k`` coordinate.

    ``GridWriter`` knows only time, ensemble and spatial dimensions; this subclass adds the
    non-spatial dimension ``k`` after the file is created (through ``h5netcdf`` on the open
    file, the way ``GridWriter`` lays out its own variables) and keeps ``k`` out of the spatial
    axes (the XDMF mesh) when a file is reopened for ``--resume``.
    """

    @classmethod
    def create(cls, path, *, k: np.ndarray, spectrum: dict, **kwargs) -> SpectrumWriter:
        """A new file (``GridWriter`` arguments) with ``spectrum(time, k)`` (float64).

        Args:
          k: shell centres, ``(n_k,)`` float64, 1/m.
          spectrum: ``units``, ``long_name`` and ``attrs`` of the variable.
        """
        import h5netcdf

        from simpar.io import netcdf

        self = cls(path, **kwargs)
        nc = h5netcdf.File(self._f, "r+")
        nc.dimensions["k"] = len(k)
        kv = nc.create_variable("k", ("k",), "f8", data=np.asarray(k, np.float64))
        kv.attrs["units"] = netcdf._text_attr("m-1")
        kv.attrs["long_name"] = netcdf._text_attr("wavenumber shell centre |k|")
        v = nc.create_variable(
            "spectrum", ("time", "k"), "f8", chunks=(1, len(k)), fillvalue=np.nan
        )
        v.attrs["units"] = netcdf._text_attr(spectrum["units"])
        v.attrs["long_name"] = netcdf._text_attr(spectrum["long_name"])
        netcdf._set_attrs(v, spectrum.get("attrs", {}))
        nc.close()
        self._f.flush()
        self._vars["spectrum"] = ("time", "k")
        return self

    def _setup(self, f, *, xdmf: bool, xdmf_min_interval: float) -> None:
        super()._setup(f, xdmf=xdmf, xdmf_min_interval=xdmf_min_interval)
        if "k" in self.coords:  # a reopened file: k is a dimension scale, not a mesh axis
            del self.coords["k"]
            if self.xdmf_path is not None:
                t = f["time"][: self.n_frames]
                s = f["step"][: self.n_frames]
                self._frames = [self._xdmf_grid(i, t[i], s[i]) for i in range(len(t))]


def plan(cfg: Section, opts: Options, config_text: str) -> SpectralPlan:
    """Read and validate a ``spectral_ns`` config (``ConfigError`` names the key); nothing
    allocated on the devices."""
    return SpectralPlan(cfg, opts, config_text)


__all__ = ["CFL_LIMIT", "SpectralPlan", "SpectralRun", "SpectrumWriter", "plan"]
