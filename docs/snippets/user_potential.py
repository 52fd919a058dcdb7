"""Your own pair potential: WCA written in Python, run decomposed and on one device.

The Weeks-Chandler-Andersen potential (Lennard-Jones cut at its minimum, 2^(1/6) sigma, and
lifted by epsilon: purely repulsive) is a pair energy of the squared distance; its forces come
from JAX. It runs on ``shard_map`` over a 2 x 4 device mesh (8 simulated CPU devices) and on
``single``, and the two trajectories agree: bitwise with XLA's fused multiply-add off
(``XLA_FLAGS=--xla_cpu_max_isa=AVX`` on x86, as the tests run), else to round-off (FMA
contracts differently in each engine's program). Run: ``python docs/snippets/user_potential.py``
(about 30 s of CPU, mostly compilation).
"""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_num_cpu_devices", 8)  # before JAX starts, CPU only

import numpy as np  # noqa: E402

from simpar.particles import decomposed_sim, lattice, md, potentials, space  # noqa: E402


def wca(r2, p):
    """WCA pair energy (epsilon) of the squared distance r2 (sigma^2)."""
    s6 = (p["sigma"] ** 2 / r2) ** 3
    return 4.0 * p["epsilon"] * (s6 * s6 - s6) + p["epsilon"]


params = {"epsilon": 1.0, "sigma": 1.0}  # array leaves: jax.grad / vmap over them work
pot = potentials.pair(wca, cutoff=2.0 ** (1 / 6), params=params)  # forces: -de/dr by JAX

r, box = lattice.cubic_lattice("fcc", 0.8442, (7, 4, 3))  # 336 atoms (sigma)
v = lattice.maxwell_boltzmann(jax.random.PRNGKey(0), r.shape[0], temperature=1.0)
spc = space.periodic(box)
one = md.make_simulation(spc, pot, r, v, dt=0.005)
many = decomposed_sim.make_domain_simulation("shard_map", (2, 4), spc, pot, r, v, dt=0.005)
one.advance(200)
many.advance(200)
a, b = one.snapshot(), many.snapshot()  # host arrays in atom-id order
gap = max(float(np.abs(b[k] - a[k]).max()) for k in ("position", "velocity", "force"))
e0, e1 = one.thermo()["total_energy"], many.thermo()["total_energy"]
print(f"largest difference {gap!r}; total energy {e0:.12f} / {e1:.12f}")
assert gap < 1e-8 and abs(e1 - e0) < 1e-10  # 0.0 with FMA off
