"""The ground floor every layer stands on: errors, settings, the store's home, the keypoint info's parts, the host (devices, memory, timing)."""
