"""A worker node's progress, shown by the host's ComfyUI.

While a node runs in its worker, PROGRESS frames from the worker's ComfyUI
progress hook drive a ``comfy.utils.ProgressBar`` here (``Progress``), in
the node's own thread and context, previews included (channel/nodes.py's
``decode_preview`` rebuilds them as the (format, PIL.Image, max_size) tuple
ComfyUI's hook takes).  Like host/nodes.py, it never assigns to a comfy module.
"""

import logging
import sys

from ..channel.nodes import decode_preview

log = logging.getLogger("bulkhead")


def _comfy_utils():
    utils = sys.modules.get("comfy.utils")
    if utils is None and "comfy" in sys.modules:
        try:
            import comfy.utils as utils  # comfyui: comfy.utils
        except Exception:
            return None
    return utils


class Progress:
    """PROGRESS frames -> a comfy.utils.ProgressBar of the node running here."""

    def __init__(self, mm):
        self.mm = mm
        self.utils = _comfy_utils()
        self.bar = None
        self.frames = 0

    def on_frame(self, v):
        self.frames += 1
        if self.utils is None or not isinstance(v, dict):
            return
        value, total = v.get("value"), v.get("total")
        if not isinstance(value, (int, float)) or not isinstance(total, (int, float)):
            return
        mm = self.mm
        if mm is not None and mm.processing_interrupted():
            return  # the interrupt is on its way to the worker; leave the flag to ComfyUI
        try:
            if self.bar is None:
                self.bar = self.utils.ProgressBar(total)
            self.bar.update_absolute(value, total, decode_preview(v.get("preview")))
        except BaseException as e:
            if mm is not None and isinstance(e, mm.InterruptProcessingException):
                # ComfyUI's hook consumed the click (a race with the check
                # above): give it back, for the watcher and ComfyUI's own check.
                mm.interrupt_current_processing(True)
            elif isinstance(e, Exception):
                log.debug("bulkhead: progress update failed: %r", e)
            else:
                raise
