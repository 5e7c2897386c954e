"""``pcd serve``: the same exact decoder over HTTP (``pcd_cli.server.app``).

One worker thread owns the model (``service.LabelService``); the HTTP event loop only parses,
validates, queues and renders. Wire formats: pcd's own ``/v1/label``, the Jev / System One API
(``/v1/systemone``, ``/v1/models``) and the OpenAI Decisions API (``/v1/decisions``), the last two
sharing one translation of questions into a pcd schema (``questions``).
"""
