"""atoll: a federated-learning runtime for sites that do not share infrastructure."""

__version__ = "0.1.0"

__all__ = ["__version__", "Session"]


def __getattr__(name: str):
    # Lazy so that `import atoll` stays cheap for the CLI and for workers.
    if name == "Session":
        from atoll.admin.session import Session

        return Session
    raise AttributeError(name)
