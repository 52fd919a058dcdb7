"""simpar: particle and grid simulations on JAX, partitioned across devices."""

__version__ = "0.1.0"
