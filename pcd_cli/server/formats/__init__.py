"""The wire formats of ``pcd serve``, one module each, all of one shape (``server/wire.py``):
``pcd`` (``/v1/label``, ``/v1/schemas``), ``jev`` (``/v1/systemone``, ``/v1/models``),
``decisions`` (OpenAI's ``/v1/decisions``) and ``label_studio`` (the ML backend's routes).
Each module ends with its declaration, ``FORMAT`` (a ``wire.WireFormat``: its routes and the headers
its clients read and send); ``server/app.py``'s ``FORMATS`` mounts them."""
