"""A skeleton of upstream's external cache provider registry (tests only):
`comfy_execution.cache_provider` of ComfyUI with the CacheProvider API.

A provider subclasses `CacheProvider`: `on_lookup(context)` and
`on_store(context, value)` are coroutines it must define (the executor's
cache consults them on a local miss and after a local store, unless
`should_cache(context, value)` says no), and `on_prompt_start(prompt_id)` /
`on_prompt_end(prompt_id)` are optional lifecycle calls the executor makes
on its own thread around every prompt, the end one in a `finally`.
Providers are called in registration order; registering one twice is a
no-op; exceptions from a provider are swallowed by the caller.  This
skeleton's executor uses only the lifecycle calls.

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import abc
import threading


class CacheProvider(abc.ABC):
    @abc.abstractmethod
    async def on_lookup(self, context):
        """A local miss: return a cached value or None."""

    @abc.abstractmethod
    async def on_store(self, context, value):
        """After a local store."""

    def should_cache(self, context, value=None):
        return True

    def on_prompt_start(self, prompt_id):
        pass

    def on_prompt_end(self, prompt_id):
        pass


_lock = threading.Lock()
_providers = []


def register_cache_provider(provider):
    with _lock:
        if provider not in _providers:
            _providers.append(provider)


def unregister_cache_provider(provider):
    with _lock:
        if provider in _providers:
            _providers.remove(provider)


def _get_cache_providers():
    with _lock:
        return tuple(_providers)


def _has_cache_providers():
    return bool(_providers)
