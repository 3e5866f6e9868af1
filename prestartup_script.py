"""ComfyUI runs every custom node's prestartup_script.py before it loads any
pack.  bulkhead's routes ``import comfy_env`` to bulkhead
(bulkhead.host.comfy_env.route), so the packs written for comfy-env --
``from comfy_env import register_nodes`` in their __init__.py -- run their
isolated nodes in bulkhead workers, even with the real comfy-env installed
beside it (their requirements.txt pins it).  Each such pack logs one line
saying bulkhead serves it.  BULKHEAD_COMFY_ENV=off hands them all back to
the real comfy-env package.  (A pack whose prestartup script runs before
this one finds comfy_env routed too: bulkhead-comfy-env.pth,
python/_bulkhead_comfy_env.py.)  Where bulkhead's package is missing, the
stand-in ``bulkhead`` is made here, before any pack is imported, whatever
the folders' order."""


def _stand_in_now():
    """bulkhead's package cannot be imported: this folder's __init__.py,
    run now under a private name, puts its stand-in ``bulkhead`` in
    sys.modules (one line naming the fix), so a pack whose folder ComfyUI
    imports before this one gets the documented in-process fallback from
    ``bulkhead.comfy_pack`` instead of failing its import; ComfyUI's own
    import of this folder later finds the stand-in made and says nothing
    more."""
    import importlib.util
    import os
    import sys
    if "bulkhead" in sys.modules:
        return
    here = os.path.dirname(os.path.realpath(__file__))
    spec = importlib.util.spec_from_file_location("_bulkhead_custom_node_prestartup",
                                                  os.path.join(here, "__init__.py"))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _route():
    """False where bulkhead cannot be imported."""
    import logging
    try:
        from bulkhead.host import comfy_env
    except Exception as e:      # not installed, or installed and failing: ComfyUI must start
        logging.getLogger("bulkhead").warning(
            "bulkhead: prestartup: bulkhead cannot be imported (%s); packs written for comfy-env "
            "run under the comfy-env package", e)
        try:
            _stand_in_now()
        except Exception as e2:  # ComfyUI must start
            logging.getLogger("bulkhead").warning("bulkhead: prestartup: no in-process stand-in: %s", e2)
        return False
    try:
        comfy_env.route()
    except Exception as e:  # ComfyUI must start
        logging.getLogger("bulkhead").warning("bulkhead: prestartup: comfy_env not routed to bulkhead: %s", e)
    return True


def _bound_spin():
    """ComfyUI imports torch after this script: its idle OpenMP threads are
    bounded here as a worker's are (bulkhead.host.spin.bound_host_spin),
    so they do not spin on the CPUs the workers need."""
    import logging
    import os
    try:
        from bulkhead.host import spin
        done = spin.bound_host_spin()
    except Exception as e:  # ComfyUI must start
        logging.getLogger("bulkhead").warning("bulkhead: prestartup: ComfyUI's idle threads left as they are: %s", e)
        return
    if done:
        logging.getLogger("bulkhead").info(
            "bulkhead: ComfyUI's idle OpenMP/BLAS threads spin %s us before they sleep (%s), as the "
            "workers' do (BULKHEAD_OMP_SPIN_US sets it)", os.environ.get("BULKHEAD_OMP_SPIN_US") or f"{spin.SPIN_US:g}",
            ", ".join(f"{k}={v}" for k, v in sorted(done.items())))


if _route():
    _bound_spin()
