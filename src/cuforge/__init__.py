"""cuforge: make GPU kernels faster by search."""

__version__ = "0.1.0"
