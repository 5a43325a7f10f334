"""The demo `make demo` runs: three hospitals train one model (outside the library's core)."""
