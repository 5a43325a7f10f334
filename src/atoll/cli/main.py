"""`atoll`: the command line. Command groups load lazily so that every call starts fast."""

from __future__ import annotations

import importlib
import os
import sys

import click

from atoll import __version__

# name -> (module, attribute, one-line help); the module is imported only when used.
COMMANDS = {
    "provision": ("atoll.cli.provision", "provision_group",
                  "Create the PKI and startup kits; add, sign or revoke participants later."),
    "server": ("atoll.cli.server", "server_group", "Start or stop the server parent."),
    "site": ("atoll.cli.site", "site_group",
             "Start or stop a site parent; list sites; render and validate a site's config."),
    "login": ("atoll.cli.login", "login_command", "Open a study-scoped session with an admin kit."),
    "logout": ("atoll.cli.login", "logout_command", "Forget the saved session."),
    "job": ("atoll.cli.job", "job_group",
            "Submit, list, watch, abort and download jobs; write a job template."),
    "study": ("atoll.cli.study", "study_group", "Manage studies: sites and users, per study."),
    "audit": ("atoll.cli.study", "audit_command", "Read the audit log (project admins)."),
    "crl": ("atoll.cli.crl", "crl_group",
            "Push the project's certificate revocation list to the server; show it."),
    "provenance": ("atoll.cli.provenance", "provenance_group",
                   "Verify a job's provenance record offline, against the project's CA; "
                   "register its model in MLflow."),
    "dashboard": ("atoll.cli.dashboard", "dashboard_command",
                  "A live view of the study in your browser: sites, jobs, curves, logs."),
    "poc": ("atoll.cli.poc", "poc_group", "Run a local federation: a server and N sites."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, _, help_) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="atoll")
def cli() -> None:
    """atoll: federated learning across sites that share no infrastructure.

    \b
    A long-lived server parent and one site parent per institution form the
    federation (mutual TLS). Each job gets a worker per site through that
    site's own launcher: a process, a Docker container, a Kubernetes pod or a
    Slurm batch job.

    \b
    Try it locally:
      atoll poc up --sites 2        # a server and two sites on this machine
      atoll job init myjob          # a FedAvg job template
      atoll job submit myjob --wait
    """


def main() -> None:
    # Parents fork workers while gRPC threads run; the workers exec at once, so gRPC's fork
    # handlers are not needed (and their warnings would only clutter the logs).
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        code = cli.main(prog_name="atoll", standalone_mode=False)
    except click.UsageError as exc:  # a mistyped command line: the usage, then one error line
        _usage_error(exc)
    except click.ClickException as exc:  # e.g. a file click could not open
        from atoll.cli.common import render_error

        render_error(exc.format_message(), fmt=_argv_format(), code=exc.exit_code)
    except click.Abort:  # Ctrl-C or EOF at a prompt
        from atoll.cli.common import render_error

        render_error(KeyboardInterrupt(), fmt=_argv_format())
    sys.exit(code if isinstance(code, int) else 0)


def _argv_format() -> str:
    """The --format asked for on the command line (a usage error leaves no parsed option)."""
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg == "--format" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--format="):
            return arg.split("=", 1)[1]
    return "text"


def _usage_error(exc: click.UsageError) -> None:
    """``error: ...`` as every other error, after click's usage line and its hint to --help."""
    from atoll.cli.common import render_error

    fmt = _argv_format()
    if fmt != "json" and exc.ctx is not None:
        hint = f"Try '{exc.ctx.command_path} -h' for help."
        click.echo(f"{exc.ctx.get_usage()}\n{hint}\n", err=True)
    render_error(exc.format_message(), fmt=fmt, code=exc.exit_code)


if __name__ == "__main__":
    main()
