"""``pcd serve``: the same exact decoder over HTTP (``pcd_cli.server.app``).

One worker thread owns the model (``service.LabelService``); the HTTP event loop only parses,
validates, queues and renders. Each wire format is one module of ``formats/`` (pcd's own
``/v1/label``, the Jev / System One API, the OpenAI Decisions API, the Label Studio ML backend),
all of one shape over ``wire.Call``; ``app.FORMATS`` mounts them. The decision questions the Jev
and OpenAI formats share are ``pcd_cli.questions``; the retrain rules, ``pcd_cli.retrain``.
"""
