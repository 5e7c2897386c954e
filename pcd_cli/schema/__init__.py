"""Schemas: the data model (``model``), files and Pydantic models read into it (``load``, ``fields``,
``jsonschema``, ``pydantic``) and rules between fields (``rules``)."""
