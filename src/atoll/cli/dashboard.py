"""`atoll dashboard`: the study in a browser, live (docs/dashboard.md)."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import (
    emit,
    fail,
    format_option,
    handle_errors,
    kit_option,
    open_session,
    study_option,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command("dashboard")
@kit_option
@study_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; another than the loopback needs --listen-public.")
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="Port to listen on (default: a free one).")
@click.option("--listen-public", is_flag=True,
              help="Allow --host to be an address others can reach (a shared machine); the "
                   "link still carries its one-time token.")
@click.option("--no-browser", is_flag=True, help="Do not open a browser; only print the link.")
@format_option
@handle_errors
def dashboard_command(kit: Path | None, study: str | None, host: str, port: int,
                      listen_public: bool, no_browser: bool, fmt: str) -> None:
    """Serve a live view of the study in your browser until Ctrl-C: its sites, its jobs (the
    queue and why each waits), each job's rounds, curves, logs, results; abort.

    It speaks to the server with your kit and session, as every command does: you see what the
    CLI shows you. It prints one link with a one-time token; the browser that opens it first
    gets a cookie, and nothing else (no key, no session) ever reaches the browser."""
    if host not in LOOPBACK and not listen_public:
        fail(f"--host {host} lets other machines reach the dashboard: add --listen-public to "
             "say so (the link keeps its one-time token)")
    session = open_session(kit)
    session.whoami()  # fail here, with the CLI's sentence, if the server or session will not do
    from atoll.dashboard.serve import serve

    def announce(url: str) -> None:  # json: one line {"url": ...} as soon as it listens
        emit({"url": url}, fmt, f"atoll dashboard: open {url}")
        click.echo("(the link works once; Ctrl-C stops the dashboard)", err=True)

    try:
        serve(session, study, host, port, listen_public, announce, open_browser=not no_browser)
    except KeyboardInterrupt:  # Ctrl-C is how it stops: not an error
        pass
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    finally:
        session.close()
    # The server stops only on a signal: uvicorn takes Ctrl-C (or TERM) itself, and whether
    # Python's KeyboardInterrupt follows depends on when asyncio sees the signal again (a CI run
    # under load saw it stop without one).
    click.echo("dashboard stopped", err=True)
