"""belugactl: operations toolkit for Beluga-style racks sharing one CXL memory pool."""

__version__ = "0.1.0"
