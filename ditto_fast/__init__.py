"""ditto-fast: batch renderer for lip-synced talking-anchor videos (Ditto method).

The engine: `Renderer` (load once, render clip after clip) and `Registrar` (register avatars);
imported on first use, so `import ditto_fast` stays light.
"""

__version__ = "0.1.0"
__all__ = ["Renderer", "RenderResult", "Registrar"]


def __getattr__(name: str):
    if name in ("Renderer", "RenderResult"):
        from . import pipeline

        return getattr(pipeline, name)
    if name == "Registrar":
        from .avatar.register import Registrar

        return Registrar
    raise AttributeError(f"module 'ditto_fast' has no attribute {name!r}")
