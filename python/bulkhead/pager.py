"""Whether a worker runs ComfyUI's dynamic pager (comfy-aimdo), and
bringing it up with the host's policy.

Inside ComfyUI the pager is switched on in one place, main.py, which a
worker never runs: left alone, every worker would stay on the legacy
ledger while its host pages.  The host exports its own state to each
worker (``BULKHEAD_WORKER_PAGER`` = 1 or 0, ``BULKHEAD_PAGER_HEADROOM``);
a pack's ``[env_vars]`` or the operator can set the variable either way
and outranks the host.  Compatibility is judged from the library's call
signatures (``control.init`` taking the keywords bulkhead passes,
``control.init_devices``), never from its version string: comfy-aimdo
releases several times a month.  A CPU worker stays on the ledger: the
pager has no CPU path.

``decide`` is pure (module in, verdict out) so tests check it with the real
package where it imports and with a module of their own otherwise.
"""

import inspect
import sys

from .channel.spec import WORKER_PAGER

INIT_KEYWORDS = ("simple_vram_headroom", "nvml_pressure")


def host_pager_enabled():
    """The host's own state: comfy.memory_management.aimdo_enabled (read,
    never written, in the host)."""
    mem = sys.modules.get("comfy.memory_management")
    return bool(getattr(mem, "aimdo_enabled", False))


def protocol_problem(control):
    """None when `control` (comfy_aimdo.control) has the calls bulkhead
    makes, else what is missing, in words."""
    init = getattr(control, "init", None)
    if not callable(init):
        return "comfy_aimdo.control has no init()"
    try:
        params = inspect.signature(init).parameters
    except (TypeError, ValueError):
        return "comfy_aimdo.control.init has no readable signature"
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    missing = [k for k in INIT_KEYWORDS if k not in params and not has_kwargs]
    if missing:
        return f"comfy_aimdo.control.init() takes no {', '.join(missing)}"
    if not callable(getattr(control, "init_devices", None)):
        return "comfy_aimdo.control has no init_devices()"
    return None


def decide(env_value, device_type, control):
    """(enabled, reason).  env_value: BULKHEAD_WORKER_PAGER as the worker
    sees it ('1', '0' or None when unset); device_type: the worker's
    torch device type; control: comfy_aimdo.control or None."""
    if env_value not in ("1", "true", "yes"):
        return False, ("the host runs the legacy ledger" if env_value is None or env_value == "0"
                       else f"{WORKER_PAGER}={env_value!r} is not 1")
    if device_type != "cuda":
        return False, f"the pager has no {device_type} path"
    if control is None:
        return False, "comfy-aimdo is not installed in this environment"
    problem = protocol_problem(control)
    if problem:
        return False, problem
    return True, "follows the host"


def import_control():
    try:
        import comfy_aimdo.control as control  # optional: comfy_aimdo
    except Exception:
        return None
    return control


def bring_up(control, headroom_bytes, device_ids):
    """Initialises the pager the way the host's main.py does, with the host's
    headroom, and tells this worker's ComfyUI it is on (worker-side only)."""
    control.init(simple_vram_headroom=int(headroom_bytes), nvml_pressure=True)
    control.init_devices(list(device_ids))
    mem = sys.modules.get("comfy.memory_management")
    if mem is not None:
        mem.aimdo_enabled = True  # worker-side: the assignment main.py makes in a host


def pager_bytes(control):
    """Bytes the pager holds on the device (torch's counters cannot see
    them), or 0."""
    try:
        return int(control.get_total_vram_usage() or 0)
    except Exception:
        return 0
