"""Floating-point precision: float64 needs 64-bit JAX, and nothing is silently narrowed.

JAX computes in float32 unless ``jax_enable_x64`` is on; with it off, a float64 request is
truncated to float32 with one warning. simpar's rule (decision):

- **The command line** (``simpar run``, ``simpar info``) turns 64-bit JAX on in its own
  process before anything is computed. A float32 config still runs in float32: every array
  simpar creates has an explicit dtype.
- **Python entry points that take a config or a dtype** (``simpar.run_file``,
  ``simpar.run.run_config``, ``simpar.grid.domain.Domain``, the particle drivers, and every
  kernel factory given ``dtype="float64"``) never change the global JAX setting of the
  caller's session: a float64 request with 64-bit JAX off raises
  :class:`~simpar.errors.ConfigError` naming the key and the fix
  (``jax.config.update("jax_enable_x64", True)`` before the first JAX computation, or
  ``float32``). Nothing is computed in one precision and labelled with another.
- **Kernel factories called without a dtype** (``potentials.lennard_jones``,
  ``space.periodic``, ``md.make_params``, ``nbody.make_params``, ...) use the dtype of their
  array input, else JAX's default float (float64 with 64-bit JAX on, float32 off), so they
  never ask for a dtype that JAX would truncate.
"""

from __future__ import annotations

import jax
import numpy as np

from simpar.errors import ConfigError

FIX = (
    'call jax.config.update("jax_enable_x64", True) at the start of the program, before the '
    'first JAX computation (the simpar command line does this), or use dtype "float32"'
)


def x64_enabled() -> bool:
    """Whether JAX computes in 64 bits in this process (``jax_enable_x64``)."""
    return bool(jax.config.jax_enable_x64)


def require(dtype, key: str) -> np.dtype:
    """Check that JAX can compute in ``dtype``; returns it as a NumPy dtype.

    Args:
      dtype: a floating dtype (``"float32"``, ``"float64"``, ``np.float64``, ...).
      key: the config key or argument that asked for it, named in the error.

    Raises:
      ConfigError: ``dtype`` is float64 (or another 64-bit type) and ``jax_enable_x64`` is
        off, so JAX would silently compute in float32.
    """
    dt = np.dtype(dtype)
    if dt.itemsize == 8 and not x64_enabled():
        raise ConfigError(
            key, f"{dt.name} needs 64-bit JAX, which is off in this Python session: {FIX}"
        )
    return dt


def require_input(x, key: str) -> None:
    """Refuse a 64-bit (NumPy) input array when JAX would truncate it to 32 bits.

    Args:
      x: an array-like input of a kernel (a JAX array already has JAX's precision; a NumPy
        ``float64``/``complex128`` array does not). Non-float inputs pass.
      key: the argument named in the error, e.g. ``"poisson.solve(f)"``.

    Raises:
      ConfigError: ``x`` is float64 or complex128 and ``jax_enable_x64`` is off.
    """
    d = getattr(x, "dtype", None)
    if d is not None and np.dtype(d) in (np.float64, np.complex128):
        require(np.float64, key)


def default_float() -> np.dtype:
    """JAX's default float: float64 with ``jax_enable_x64`` on, else float32."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.float64))


def resolve(dtype=None, like=None, key: str = "dtype") -> np.dtype:
    """The dtype a kernel factory should use.

    Args:
      dtype: an explicit request (checked with :func:`require`), or None.
      like: an input value; with ``dtype`` None its floating dtype is used (a float64
        NumPy array becomes float32 when 64-bit JAX is off, without a warning).
      key: the argument name for the error message.

    Returns:
      ``dtype`` if given, else the dtype of ``like`` if it is a floating array, else
      :func:`default_float`.
    """
    if dtype is not None:
        return require(dtype, key)
    d = getattr(like, "dtype", None)
    if d is not None and np.issubdtype(d, np.floating):
        return np.dtype(jax.dtypes.canonicalize_dtype(d))
    return default_float()
