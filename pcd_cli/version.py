"""pcd's version (its own leaf module, so that no stage imports the package root)."""

__version__ = "0.1.0"
