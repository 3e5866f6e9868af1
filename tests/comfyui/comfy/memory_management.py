"""Host-RAM knobs the memory manager reads (the pager itself is not modelled).

`aimdo_enabled` stays False: this stand-in has no dynamic (paged) loader.
`RAM_CACHE_HEADROOM` and `extra_ram_release` are the hooks ComfyUI's RAM
cache installs; with no cache installed a release frees nothing.
"""

aimdo_enabled = False

RAM_CACHE_HEADROOM = 0
extra_ram_release_callback = None


def set_ram_cache_release_state(callback, headroom):
    global extra_ram_release_callback, RAM_CACHE_HEADROOM
    extra_ram_release_callback = callback
    RAM_CACHE_HEADROOM = max(0, int(headroom))


def extra_ram_release(target, free_active=False):
    if extra_ram_release_callback is None:
        return 0
    return extra_ram_release_callback(target, free_active=free_active)
