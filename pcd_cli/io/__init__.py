"""Files in and out: input rows to records (``readers``, ``values``), the output columns and Parquet
sink (``output``) and every write made atomic (``files``)."""
