"""ditto-fast: batch renderer for lip-synced talking-anchor videos (Ditto method).

The engine: `Renderer` (load once, render clip after clip, set up by `EngineOptions`) renders
`RenderRequest`s, and `Registrar` registers avatars; imported on first use, so `import ditto_fast` stays light.
"""

from ditto_fast.core.version import __version__

__all__ = ["EngineOptions", "Renderer", "RenderRequest", "RenderResult", "Registrar", "__version__"]
_ENGINE = {"EngineOptions": "ditto_fast.engine.options",
           "Renderer": "ditto_fast.engine.renderer", "RenderResult": "ditto_fast.engine.renderer",
           "RenderRequest": "ditto_fast.engine.request", "Registrar": "ditto_fast.avatar.register"}


def __getattr__(name: str):
    if name in _ENGINE:
        import importlib

        return getattr(importlib.import_module(_ENGINE[name]), name)
    raise AttributeError(f"module 'ditto_fast' has no attribute {name!r}")
