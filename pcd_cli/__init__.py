"""pcd: batch labelling with parallel constrained decoding."""

__version__ = "0.1.0"
