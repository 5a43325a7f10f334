"""`atoll`: the command line. Command groups load lazily so that every call starts fast."""

from __future__ import annotations

import importlib
import os

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
    cli(prog_name="atoll")


if __name__ == "__main__":
    main()
