"""The ground floor every layer stands on: errors, settings, the store's home, the host (devices, memory, timing)."""
