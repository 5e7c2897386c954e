"""Engines decide where chunks of records run, never how they are decoded.

* **local** (``pcd_cli.engines.local.label_file``): one process reads the input, labels it with one
  ``Labeler`` and commits checkpointed batches (``--resume``).
* **ray** (``pcd_cli.engines.ray_engine``, extra ``pcd-cli[ray]``): the same ``Labeler``
  built once in each Ray Data actor of a pool; rows become records by the same reader
  (``pcd_cli.io.readers``) and results become Arrow by the same ``output.results_table``, so both
  engines write the same columns, types, key-value metadata and errors.

An engine takes the ``Labeler`` keyword arguments as one dict (built once by the CLI), so an
option added to ``Labeler`` reaches every engine without changes here.
"""

ENGINES = ("local", "ray")
