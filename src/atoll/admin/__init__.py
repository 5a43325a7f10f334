"""The Python admin API: `Session` (what the CLI and notebooks call) and its errors."""
