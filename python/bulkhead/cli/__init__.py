"""What runs only from the command line, never inside ComfyUI: the drift
canary (``canary``, its ``ast`` walk ``canarywalk``), ``doctor`` and
``uninstall``.
``python -m bulkhead`` (the package's ``__main__.py``, which the C
``bulkhead`` command execs) imports each when its verb is asked for.
This package may import ``host/``; nothing in ``host/`` imports it."""
