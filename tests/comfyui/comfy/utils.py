"""The parts of `comfy.utils` node code and the model patcher lean on:
the progress bar with its process-wide hook, and dotted attribute access
on modules.

ProgressBar sends to the hook captured at construction.  The first update,
the final one (value reaches total) and any update carrying a preview are
always sent; others only once both PROGRESS_THROTTLE_MIN_INTERVAL seconds
and PROGRESS_THROTTLE_MIN_PERCENT percent have passed since the last one
sent (upstream throttles to spare its websocket).
"""

import time

import torch

PROGRESS_BAR_ENABLED = True
PROGRESS_BAR_HOOK = None
PROGRESS_THROTTLE_MIN_INTERVAL = 0.1
PROGRESS_THROTTLE_MIN_PERCENT = 0.5


def set_progress_bar_enabled(enabled):
    global PROGRESS_BAR_ENABLED
    PROGRESS_BAR_ENABLED = enabled


def set_progress_bar_global_hook(function):
    global PROGRESS_BAR_HOOK
    PROGRESS_BAR_HOOK = function


class ProgressBar:
    def __init__(self, total, node_id=None):
        self.total = total
        self.current = 0
        self.hook = PROGRESS_BAR_HOOK
        self.node_id = node_id
        self._sent_at = 0.0
        self._sent_value = -1

    def _send(self, preview, now):
        self.hook(self.current, self.total, preview, node_id=self.node_id)
        self._sent_at = now
        self._sent_value = self.current

    def update_absolute(self, value, total=None, preview=None):
        if total is not None:
            self.total = total
        self.current = min(value, self.total)
        if self.hook is None:
            return
        now = time.perf_counter()
        if preview is not None or self._sent_value < 0 or self.current >= self.total:
            self._send(preview, now)
            return
        if self.total > 0:
            moved_pct = (self.current - max(0, self._sent_value)) * 100.0 / self.total
        else:
            moved_pct = 100.0
        if (now - self._sent_at >= PROGRESS_THROTTLE_MIN_INTERVAL
                and moved_pct >= PROGRESS_THROTTLE_MIN_PERCENT):
            self._send(preview, now)

    def update(self, value):
        self.update_absolute(self.current + value)


def get_attr(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def set_attr(obj, dotted, value):
    """Set a dotted attribute; returns the value it replaced."""
    *parents, last = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    old = getattr(obj, last)
    setattr(obj, last, value)
    return old


def set_attr_param(obj, dotted, value):
    return set_attr(obj, dotted, torch.nn.Parameter(value, requires_grad=False))


def copy_to_param(obj, dotted, value):
    get_attr(obj, dotted).data.copy_(value)
