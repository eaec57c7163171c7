"""ditto-fast: batch renderer for lip-synced talking-anchor videos (Ditto method)."""

__version__ = "0.1.0"
