"""``spectral_ns`` (pseudo-spectral incompressible flow, 2-D and 3-D) in the driver.

:func:`plan` reads the model's config (``[grid] shape, length, dtype``; ``[physics]
viscosity, drag, scheme``; ``[forcing] kind, amplitude, wavenumber``; ``[initial] kind`` and
its keys; ``time.dt``; ``output.fields``), builds the initial field on the host, checks the
time step against the advective CFL limit (and, for ``rk4``, the viscous one) and the mesh
against the FFT's transposes. The shared options (engine, mesh, steps, ``output.every``, path,
checkpoint) come from ``simpar.drive.loop.read_options``. :class:`SpectralRun` maps the
physics over the devices with ``simpar.parallel.spectral_engine.SpectralEngine``:

- 2-D (``grid.shape = [N_x, N_y]``): ``simpar.grid.spectral_ns``, vorticity-streamfunction;
  ``initial.kind`` ``"taylor_green"`` (``wavenumber``, ``amplitude``) or ``"random"``
  (``seed``, ``peak_wavenumber``, ``energy``).
- 3-D (``[N_x, N_y, N_z]``): ``simpar.grid.spectral_ns3d``, velocity form; ``initial.kind``
  ``"taylor_green"`` or ``"abc"`` (``a``, ``b``, ``c``; a 2 pi cube), both scaled by
  ``amplitude`` (``wavenumber`` may only be 1).

**State** on the devices: the Fourier coefficients (2-D: vorticity ``omega_hat``; 3-D:
velocity ``u_hat``, 3 components), complex, in the plan's Fourier layout. **Output**
(``simpar.io.netcdf.GridWriter``, netCDF4/HDF5 + XDMF sidecar): ``vorticity`` (2-D) or
``vorticity_x, _y, _z`` (3-D) and ``u, v[, w]`` as ``(time, [z,] y, x)`` at the grid points
``x_i = i L_x / N_x`` (where the spectral solution is sampled); the diagnostics of
``diagnostics()`` (``energy``, ``enstrophy``, ``max_speed``, ``cfl``; 3-D also ``helicity``
and ``divergence_bound``) as ``(time,)``; the shell-summed energy spectrum
``spectrum(time, k)`` with the coordinate ``k`` (shell centres ``n 2 pi / max(L)``, 1/m).

**Checkpoints** hold the Fourier state itself, so ``--resume`` continues bit for bit on the
same engine: ``vorticity_hat_re``/``_im`` ``(N_x, N_y // 2 + 1)`` (2-D) or
``velocity_hat_re``/``_im`` ``(3, N_x, N_y, N_z // 2 + 1)`` (3-D), float, the real and
imaginary parts of the unnormalised, 2/3-truncated ``rfftn`` without the per-mesh zero padding
of the half axis (so a checkpoint also resumes on another engine or mesh, then equal to
round-off).

Units are SI (``m``, ``s``; any consistent set works: the experiments use a ``2 pi`` box).
"""

from __future__ import annotations

import math
import sys
from types import ModuleType
from typing import NamedTuple

import numpy as np

from simpar import precision
from simpar.config import Section
from simpar.drive.grid import check_spectral_memory
from simpar.drive.loop import ModelAdapter, Options, Plan, Run, device_mesh, rate, read_options
from simpar.errors import ConfigError
from simpar.grid import spectral_ns as S
from simpar.grid import spectral_ns3d as S3
from simpar.io.netcdf import GridWriter
from simpar.parallel.spectral_engine import Layout, SpectralEngine

CFL_LIMIT = 1.0
"""Largest ``dt (max|u| / dx + max|v| / dy)`` of the initial field accepted (RK4's advective
limit on the 2/3-truncated spectrum is about 1.35; the margin leaves room for the flow to
speed up)."""
RK4_VISCOUS_LIMIT = 2.78
"""Largest ``nu |k_max|^2 dt`` for the classical ``rk4`` scheme (``ifrk4`` has no limit)."""

FIELDS = ("vorticity", "velocity")
_UNITS = {
    "vorticity": ("s-1", "vorticity"),
    "u": ("m s-1", "velocity x component"),
    "v": ("m s-1", "velocity y component"),
    "w": ("m s-1", "velocity z component"),
    "energy": ("m2 s-2", "kinetic energy per unit mass, domain mean"),
    "enstrophy": ("s-2", "enstrophy (half the mean squared vorticity)"),
    "helicity": ("m s-2", "helicity, domain mean of u . omega"),
    "divergence_bound": ("s-1", "bound on max |div u| (round-off for a valid state)"),
    "max_speed": ("m s-1", "largest speed on the grid"),
    "cfl": ("1", "advective CFL number dt sum_a max|u_a| / dx_a"),
    "spectrum": ("m2 s-2", "kinetic energy in the wavenumber shell"),
}
INITIAL = {2: ("taylor_green", "random", "file"), 3: ("taylor_green", "abc", "file")}
"""``initial.kind`` choices per grid dimension."""


class _Form(NamedTuple):
    """The 2-D (vorticity) or 3-D (velocity) form of the physics, as the adapter calls it."""

    module: ModuleType  # spectral_ns or spectral_ns3d
    state: str  # checkpoint name stem of the Fourier state
    nlead: int  # component axes of the state: 0 (omega_hat) or 1 (u_hat, 3 components)
    vorticity: tuple[str, ...]  # output variable names of the vorticity components
    velocity: tuple[str, ...]

    def to_state(self, x, p, ops):
        return self.module.to_state(x, ops) if self.nlead == 0 else S3.to_state(x, p, ops)

    def fields(self, st, p, ops):
        """(vorticity, velocity) on the grid: ``(*grid)`` or ``(3, *grid)``, and ``(d, *grid)``."""
        if self.nlead == 0:
            return S.to_physical(st, ops), S.velocity(st, p, ops)
        return S3.vorticity(st, p, ops), S3.to_physical(st, ops)


_FORMS = {
    2: _Form(S, "vorticity_hat", 0, ("vorticity",), ("u", "v")),
    3: _Form(S3, "velocity_hat", 1, ("vorticity_x", "vorticity_y", "vorticity_z"), ("u", "v", "w")),
}


def _initial(cfg: Section, shape, length, dtype) -> tuple[np.ndarray, int | None]:
    """The initial field on the host and the seed (or None): 2-D the vorticity ``(N_x, N_y)``
    (1/s), 3-D the velocity ``(3, N_x, N_y, N_z)`` (m/s); NumPy, ``dtype``."""
    ini = cfg.section("initial")
    kind = ini.get("kind", "taylor_green", kind=str, choices=INITIAL[len(shape)])
    if kind == "file":  # a frame of an earlier output (2-D: vorticity; 3-D: u, v, w)
        from simpar.io import initial_file

        path, frame = initial_file.from_config(ini)
        names = ("vorticity",) if len(shape) == 2 else _FORMS[3].velocity
        got = initial_file.read_fields(path, frame, {n: (tuple(shape), dtype) for n in names})
        x = got["vorticity"] if len(shape) == 2 else np.stack([got[n] for n in names])
        return x, None
    if len(shape) == 3:  # the 3-D fields have wavenumber 1 along every axis
        ini.get("wavenumber", 1, kind=int, min=1, max=1)
        amp = ini.get("amplitude", 1.0)
        if kind == "taylor_green":
            return S3.taylor_green(shape, length, amp, dtype=dtype), None
        if not np.allclose(length, 2 * math.pi, rtol=1e-12):
            raise ConfigError("grid.length", f"the ABC flow needs a 2 pi cube, got {length}")
        abc = [amp * ini.get(k, d) for k, d in (("a", 1.0), ("b", 0.7), ("c", 0.4))]
        return S3.abc_flow(shape, *abc, dtype=dtype), None
    if kind == "taylor_green":
        n = ini.get("wavenumber", 1, kind=int, min=1)
        if 3 * n >= min(shape):
            raise ConfigError(
                ini.key("wavenumber"),
                f"{n} is cut by the 2/3 rule on grid {shape}; need 3 * wavenumber < {min(shape)}",
            )
        amp = ini.get("amplitude", 1.0)
        return S.taylor_green(shape, length, wavenumber=n, amplitude=amp, dtype=dtype), None
    seed = ini.get("seed", 0, kind=int, min=0, max=2**63 - 1)
    peak = ini.get("peak_wavenumber", 4.0, min=0.0, max=1e6, exclusive_min=True)
    energy = ini.get("energy", 0.5, min=0.0, exclusive_min=True)
    w = S.random_turbulence(shape, length, seed=seed, peak_wavenumber=peak, energy=energy)
    return w.astype(dtype), seed


def source_mean_warning(source: np.ndarray, what: str, units: str) -> str | None:
    """The one-line warning ``simpar run`` prints when a Poisson source has a mean.

    A periodic Poisson solve (``simpar.grid.poisson.solve``; here the stream function of
    the 2-D vorticity, ``lap(psi) = -omega``) solves with ``f - mean(f)``: the mean is
    dropped without a word. Round-off is allowed: ``|mean| <= 100 eps max|f|``.

    Args:
      source: the host field (any shape, float).
      what, units: how the message names the field and its units.

    Returns:
      The message, or None when the mean is at round-off.
    """
    f = np.asarray(source)
    mean = float(np.mean(f, dtype=np.float64))
    scale = float(np.max(np.abs(f))) if f.size else 0.0
    if not abs(mean) > 100 * np.finfo(f.dtype).eps * scale:
        return None
    return (
        f"simpar: warning: the {what} has mean {mean:.6g} {units} (max |value| {scale:.6g}); "
        "the periodic Poisson solve drops the mean, so the velocity is that of the field "
        "minus its mean"
    )


def _host_cfl(x: np.ndarray, length, dt: float) -> float:
    """``dt sum_a max|u_a| / dx_a`` of a host initial field (2-D vorticity: NumPy FFTs)."""
    if x.ndim == 2:
        n0, n1 = x.shape
        kx = 2 * math.pi * np.fft.fftfreq(n0, 1.0 / n0)[:, None] / length[0]
        ky = 2 * math.pi * np.fft.rfftfreq(n1, 1.0 / n1)[None, :] / length[1]
        k2 = kx * kx + ky * ky
        psi = np.fft.rfft2(x.astype(np.float64)) / np.where(k2 == 0, 1, k2)
        x = np.stack([np.fft.irfft2(c * psi, s=(n0, n1)) for c in (1j * ky, -1j * kx)])
    dx = [L / n for L, n in zip(length, x.shape[1:], strict=True)]
    return dt * sum(np.abs(x[a]).max() / dx[a] for a in range(len(dx)))


class SpectralPlan(Plan):
    """A validated ``spectral_ns`` run (initial field on the host; nothing on the devices).

    Attributes:
      common: the shared options; model, engine, mesh, dtype: for the metadata and summary.
      shape, length: the grid ``(N_x, N_y[, N_z])`` (cells) and box (m).
      form: the 2-D vorticity or the 3-D velocity form (``simpar.grid.spectral_ns[3d]``).
      x0: initial field, host: 2-D vorticity ``(N_x, N_y)`` (1/s), 3-D velocity
        ``(3, N_x, N_y, N_z)`` (m/s), of ``dtype``.
      nu, drag, dt, scheme, forcing: the physics (``spectral_ns.make_params``).
      fields: output fields (``vorticity``, ``velocity``).
      eng: the ``SpectralEngine`` (mesh checked against the transposes).
    """

    first_step = 0

    def __init__(self, cfg: Section, opts: Options, config_text: str):
        cfg.section("model", required=True).get("name", kind=str, choices=("spectral_ns",))
        g = cfg.section("grid", required=True)
        self.shape = tuple(g.get("shape", kind=int, length=(2, 3), min=2))
        d = len(self.shape)
        self.form = _FORMS[d]
        self.length = tuple(
            g.get("length", [2 * math.pi] * d, length=d, min=0.0, exclusive_min=True)
        )
        if not (1e-100 <= min(self.length) and max(self.length) <= 1e100):  # wavenumbers
            raise ConfigError(g.key("length"), f"{list(self.length)}: each length must lie in "
                              "1e-100 .. 1e100")  # fmt: skip
        self.dtype = g.get("dtype", "float32", kind=str, choices=("float32", "float64"))
        precision.require(self.dtype, g.key("dtype"))
        check_spectral_memory(self.shape, self.dtype, g.key("shape"))  # before the initial field
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
        self.x0, self.seed = _initial(cfg, self.shape, self.length, np.dtype(self.dtype))
        if d == 2:  # the stream function solves lap(psi) = -omega: omega's mean is dropped
            msg = source_mean_warning(self.x0, "initial vorticity", "s-1")
            if msg is not None:
                print(msg, file=sys.stderr)
        t = cfg.section("time")
        self.dt = t.get("dt", min=0.0, exclusive_min=True)
        o = cfg.section("output")
        fields = o.get("fields", list(FIELDS), kind=str, length=(1, 2), choices=FIELDS)
        if len(set(fields)) != len(fields):
            raise ConfigError(o.key("fields"), f"lists a field twice: {fields}")
        self.fields = tuple(fields)
        self.common = c = read_options(
            cfg, opts, default_path="data/runs/spectral_ns.nc", output="netcdf"
        )
        self._check_dt(t.key("dt"))
        self.model, self.engine = "spectral_ns", c.engine
        self.config_text = config_text
        self.save_checkpoints = c.checkpoint
        self.ck = None
        if c.resume:  # names, shapes, dtypes, finiteness, before the run is built
            from simpar.io import checkpoint

            want = (self.state_shape(), np.dtype(self.dtype))
            checkpoint.load_for_resume(c.path, config_text, self.model,
                                       expected=dict.fromkeys(self.state_names(), want))  # fmt: skip
        mesh = device_mesh(c)
        self.eng = SpectralEngine(c.engine, self.shape, mesh, real=True, key=c.mesh_key)
        self.mesh = tuple(self.eng.plan.mesh)

    def _check_dt(self, key: str) -> None:
        speed = "initial.energy" if self.seed is not None else "initial.amplitude"
        if not np.all(np.isfinite(self.x0)):
            raise ConfigError(speed if self.seed is None or np.isfinite(self.x0).any()
                              else "initial", "gives a non-finite initial field")  # fmt: skip
        cfl = _host_cfl(self.x0, self.length, self.dt)
        if not cfl <= CFL_LIMIT * 1e6:  # no sensible dt fixes this: the initial flow is absurd
            raise ConfigError(
                speed,
                f"the initial field moves {cfl / self.dt:.3g} cells per unit time (advective "
                f"CFL number {cfl:.3g} at time.dt = {self.dt:g}); give a speed of order 1",
            )
        if not cfl <= CFL_LIMIT:
            raise ConfigError(
                key,
                f"dt = {self.dt:g} gives an advective CFL number of {cfl:.3g} for the initial "
                f"field (dt sum_a max|u_a| / dx_a); the limit is {CFL_LIMIT}: use dt <= "
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

    def state_shape(self) -> tuple[int, ...]:
        """Shape of the checkpointed Fourier state: ``(N_x, N_y // 2 + 1)`` (2-D) or
        ``(3, N_x, N_y, N_z // 2 + 1)`` (3-D)."""
        lead = (3,) * self.form.nlead
        return lead + self.shape[:-1] + (self.shape[-1] // 2 + 1,)

    def state_names(self) -> tuple[str, str]:
        """The checkpoint arrays: real and imaginary part of the Fourier state."""
        return (f"{self.form.state}_re", f"{self.form.state}_im")

    def check_resume(self, ck: dict, ck_step: int) -> int:
        """Check the checkpoint's Fourier state against the grid; the run starts at step 0."""
        for name in self.state_names():
            a = ck.get(name)
            if a is None or a.shape != self.state_shape() or a.dtype != np.dtype(self.dtype):
                got = None if a is None else f"{a.shape} {a.dtype}"
                from simpar.io.checkpoint import checkpoint_path

                raise ConfigError(
                    "--resume",
                    f"{checkpoint_path(self.common.path)}: dataset /state/{name} is {got}, "
                    f"expected {self.state_shape()} {self.dtype}; it was not written by this "
                    "spectral_ns config",
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

        self.plan, eng, form = plan, plan.eng, plan.form
        self.eng = eng
        ops, comm = eng.ops, eng.comm
        scheme = plan.scheme
        self.desc = f"spectral_ns/{plan.engine}"
        self.params = plan.params()
        self.state_layout = state = Layout(True, form.nlead)
        self.out_layouts = (Layout(False, form.nlead), Layout(False, 1))

        def observe(st, p):
            d = form.module.diagnostics(st, p, ops, comm)
            bad = jnp.sum(~jnp.isfinite(st)).astype(jnp.int32)
            d["nonfinite"] = bad if comm is None else comm.psum(bad)
            return d

        self._observe = eng.map(observe, (state, None), None)
        self._fields = eng.map(
            lambda st, p: form.fields(st, p, ops), (state, None), self.out_layouts
        )
        self._advance = eng.map(
            lambda st, p, n: form.module.advance(st, p, ops, n, scheme), (state, None, None),
            state, donate=True,
        )  # fmt: skip
        if plan.ck is None:
            real = Layout(False, form.nlead)
            to_state = eng.map(lambda x, p: form.to_state(x, p, ops), (real, None), state)
            self.state = to_state(eng.place(plan.x0, real), self.params)
        else:
            re, im = (plan.ck[n] for n in plan.state_names())
            st = (re + 1j * im).astype(np.complex64 if plan.dtype == "float32" else np.complex128)
            pad = eng.plan.fourier_shape[-1] - st.shape[-1]
            self.state = eng.place(np.pad(st, [(0, 0)] * (st.ndim - 1) + [(0, pad)]), state)

    def observe(self) -> dict:
        d = self._observe(self.state, self.params)
        return {k: self.eng.gather(v, None) for k, v in d.items()}

    def initial_problem(self, obs) -> None:
        self.obs0 = obs  # its keys name the diagnostics' variables in a new file
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
            f"{bad} non-finite Fourier coefficients of the {self.plan.form.state} after step "
            f"{step} (time.dt = {self.plan.dt:g}, physics.viscosity = {self.plan.nu:g})",
            "The flow outran the time step: reduce time.dt (keep the CFL number written in the "
            "output below about 1) or raise physics.viscosity",
        )

    def postfix(self, obs) -> dict:
        return {"E": f"{float(obs['energy']):.4g}", "CFL": f"{float(obs['cfl']):.2f}"}

    def snapshot(self):
        vort, vel = self._fields(self.state, self.params)
        st = self.eng.gather(self.state, self.state_layout)[..., : self.plan.shape[-1] // 2 + 1]
        return {
            "vorticity": self.eng.gather(vort, self.out_layouts[0]),
            "velocity": self.eng.gather(vel, self.out_layouts[1]),
            "state": st,
        }

    def checkpoint_state(self, snap, step) -> dict:
        st = snap["state"]
        re, im = self.plan.state_names()
        return {re: np.ascontiguousarray(st.real), im: np.ascontiguousarray(st.imag)}

    def _names(self) -> dict[str, tuple[str, ...]]:
        """Output field -> its variables (``vorticity``: 1 or 3 components; ``velocity``)."""
        form = self.plan.form
        return {f: getattr(form, f) for f in FIELDS if f in self.plan.fields}

    def _values(self, snap, obs) -> dict:
        out = {}
        for f, names in self._names().items():
            x = snap[f].reshape((len(names),) + self.plan.shape)
            out.update({n: np.transpose(x[i]) for i, n in enumerate(names)})  # (z,) y, x
        out.update({k: v for k, v in obs.items() if k != "nonfinite"})
        return out

    def open_writer(self, path, *, resume_step, overwrite, key):
        from simpar.io.meta import run_metadata

        p, obs = self.plan, self.obs0
        axes = ("x", "y", "z")[: len(p.shape)]
        step_coord = {"coordinates": "step"}
        variables = {}
        for names in self._names().values():
            for n in names:
                units, long_name = _UNITS.get(n, _UNITS["vorticity"])
                if n.startswith("vorticity_"):
                    long_name = f"vorticity {n[-1]} component"
                variables[n] = {
                    "dims": ("time", *reversed(axes)), "dtype": p.dtype, "units": units,
                    "long_name": long_name, "attrs": step_coord,
                }  # fmt: skip
        for n in obs:
            if n in ("nonfinite", "spectrum"):
                continue
            units, long_name = _UNITS[n]
            variables[n] = {
                "dims": ("time",), "dtype": "float64", "units": units, "long_name": long_name,
                "attrs": step_coord,
            }  # fmt: skip
        attrs = run_metadata(
            p.config_text, engine=p.engine, mesh=p.mesh, dtype=p.dtype, seed=p.seed,
            model=p.model,
        )  # fmt: skip
        re, im = p.state_names()
        attrs.update(
            {
                "dt": float(p.dt),
                "viscosity": float(p.nu),
                "scheme": p.scheme,
                "grid_shape": np.asarray(p.shape, np.int32),
                "grid_length": np.asarray(p.length, np.float64),
                "checkpoint_state": f"{re}, {im}: rfftn of the state, 2/3-truncated",
            }
        )
        # the grid points x_i = i L / N, where the spectral solution is sampled
        coords = {a: np.arange(p.shape[i]) * (p.length[i] / p.shape[i]) for i, a in enumerate(axes)}
        coords = dict(reversed(coords.items()))  # (z,) y, x
        k = np.arange(p.form.module.n_shells(self.eng.ops)) * (2 * math.pi / max(p.length))
        units, long_name = _UNITS["spectrum"]
        variables["spectrum"] = {
            "dims": ("time", "k"), "dtype": "float64", "units": units, "long_name": long_name,
            "attrs": step_coord,
        }  # fmt: skip
        extra = {"k": {"data": k, "units": "m-1", "long_name": "wavenumber shell centre |k|"}}
        new = lambda p, **kw: GridWriter(  # noqa: E731
            p, coords=coords, variables=variables, extra_dims=extra, attrs=attrs,
            xdmf_min_interval=2.0, time_units="s", length_units="m",
            coord_points="grid points i L / N, i = 0 .. N-1", **kw,
        )  # fmt: skip
        if resume_step is not None:  # the old file must have the layout of a new one
            return GridWriter.open_existing(path, step=resume_step, xdmf_min_interval=2.0,
                                            like=new)  # fmt: skip
        return new(path, overwrite=overwrite, key=key)

    def write_frame(self, writer, step, snap, obs) -> None:
        writer.append(step, step * self.plan.dt, self._values(snap, obs))

    def summary(self, obs0, obs, steps_run, wall) -> dict:
        p = self.plan
        cells = math.prod(p.shape)
        scalars = lambda o: {k: float(v) for k, v in o.items() if np.ndim(v) == 0}  # noqa: E731
        return dict(
            **rate(cells / 1e6, steps_run, wall, "Mcell_updates/s"),
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


def plan(cfg: Section, opts: Options, config_text: str) -> SpectralPlan:
    """Read and validate a ``spectral_ns`` config (``ConfigError`` names the key); nothing
    allocated on the devices."""
    return SpectralPlan(cfg, opts, config_text)


model = ModelAdapter(
    "spectral_ns", plan, "pseudo-spectral incompressible flow, 2-D / 3-D (distributed FFT)"
)
"""The ``spectral_ns`` model (``simpar.models``)."""

__all__ = ["CFL_LIMIT", "SpectralPlan", "SpectralRun", "model", "plan"]
