"""``atoll provision request|sign|assemble|revoke``: keys that never leave their owner, and
revocation.

    atoll provision request --name EMAIL|SITE --org ORG [--role ROLE] [--out DIR]   participant
    atoll provision sign DIR/<project> REQUEST.csr [--out FILE] [--yes]             project admin
    atoll provision assemble NAME.signed.json --kit DIR/<name>                      participant
    atoll provision revoke DIR/<project> NAME [--reason REASON]                     project admin

Loaded only when one of them runs (or for --help): ``atoll provision`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from atoll.cli.common import emit, format_option
from atoll.cli.provision import _guarded
from atoll.pki.crl import REASONS
from atoll.pki.identity import ROLES


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _who(kind: str, name: str, org: str, role: str | None) -> str:
    about = f"org {org}" + (f", role {role}" if role else "")
    return f"{'user' if kind == 'admin' else kind} {name} ({about})"


@click.command("request")
@click.option("--name", required=True,
              help="Your name: an email address for a user, a site name for a site.")
@click.option("--org", required=True, help="Your organization.")
@click.option("--role", type=click.Choice(ROLES), default=None,
              help="A user's role (the project admin sees it before signing); "
                   "leave it out to request a site's certificate.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("."), show_default=True, help="Folder to write <name>/ into.")
@format_option
def request_command(name: str, org: str, role: str | None, out_dir: Path, fmt: str) -> None:
    """Make your own key and a certificate signing request for the project admin.

    The key is written into OUT/<name>/startup/ (0600, in 0700 folders) and never leaves it:
    only OUT/<name>/<name>.csr is sent. Your kit is assembled in that same folder."""
    from atoll.pki.request import make_request

    made = _guarded(lambda: make_request(out_dir, name, org, role))
    if fmt == "json":
        emit({"name": name, "kind": made.kind, "org": org, "role": role,
              "folder": str(made.folder), "key": str(made.key), "csr": str(made.csr)}, fmt)
        return
    out = _out()
    out.print(f"Made a key and a signing request for the {escape(_who(made.kind, name, org, role))}:")
    out.print(f"  {escape(str(made.folder))}/   keep this folder: your kit is assembled in it")
    out.print(f"    startup/{escape(made.key.name)}   your private key; never send it")
    out.print(f"    {escape(made.csr.name)}   send this file to the project admin")
    out.print("When the project admin sends back the signed bundle:\n"
              f"  atoll provision assemble {escape(name)}.signed.json --kit "
              f"{escape(str(made.folder))}")


@click.command("sign")
@click.argument("project_dir", metavar="DIR/PROJECT", type=click.Path(path_type=Path))
@click.argument("csr", metavar="REQUEST.csr", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the signed bundle [default: <name>.signed.json beside "
                   "the request].")
@click.option("--yes", "-y", is_flag=True,
              help="Sign without asking; for scripts that checked the request themselves.")
@format_option
def sign_command(project_dir: Path, csr: Path, out: Path | None, yes: bool, fmt: str) -> None:
    """Sign a participant's certificate signing request with the project's CA.

    The request names who it asks to be (name, org, and a user's role): check it before you
    sign. The certificate is recorded in ca/state.json like `add-site` / `add-user`; the signed
    bundle holds no private key and may be sent back by any channel."""
    from atoll.pki.sign_request import read_request, sign_request

    info = _guarded(lambda: read_request(csr))
    json_out = fmt == "json"  # then what is said to the person goes to stderr
    out_ = Console(highlight=False, soft_wrap=True, stderr=json_out)
    out_.print(f"{escape(str(csr))} asks for the certificate of the "
               f"{escape(_who(info.kind, info.name, info.org, info.role))}.")
    if not yes:
        click.confirm("Sign it?", abort=True, err=json_out)
    signed = _guarded(lambda: sign_request(project_dir, info, out, csr))
    if json_out:
        emit({"name": info.name, "kind": info.kind, "org": info.org, "role": info.role,
              "serial": signed.serial, "bundle": str(signed.bundle),
              "ca_fingerprint": signed.ca_fingerprint}, fmt)
        return
    out_.print(f"Signed (serial {signed.serial}). Send {escape(str(signed.bundle))} back to "
               f"{escape(info.name)}; it holds no private key.")
    out_.print(f"The project's root CA fingerprint (SHA-256), for them to compare when they "
               f"assemble their kit:\n  {signed.ca_fingerprint}")
    step = ("`atoll study add-site`" if info.kind == "site" else "`atoll study add-user`")
    out_.print(f"Then enrol them in a study with {step}.")


@click.command("assemble")
@click.argument("bundle", metavar="NAME.signed.json",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--kit", "kit_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Your folder from `atoll provision request` (OUT/<name>), with your key.")
@format_option
def assemble_command(bundle: Path, kit_dir: Path, fmt: str) -> None:
    """Assemble your startup kit from the signed bundle, around the key you kept.

    Checks that the certificate is for your key and signed by the bundle's root CA; compare
    that CA's fingerprint (printed) with the one the project admin gave you."""
    from atoll.parent.local_config import record_kits
    from atoll.pki.request import assemble

    made = _guarded(lambda: assemble(bundle, kit_dir))
    record_kits(made.folder)
    if fmt == "json":
        emit({"name": made.name, "kind": made.kind, "org": made.org, "role": made.role,
              "folder": str(made.folder), "ca_fingerprint": made.ca_fingerprint}, fmt)
        return
    out = _out()
    out.print(f"Assembled the kit of the {escape(_who(made.kind, made.name, made.org, made.role))}"
              f" in {escape(str(made.folder))}/")
    out.print(f"Root CA fingerprint (SHA-256): {made.ca_fingerprint}\n"
              "  it must be the one the project admin gave you; if not, do not use this kit.")
    if made.kind == "site":
        out.print("Edit local/site.yaml and local/study_runtime.yaml, then: atoll site start "
                  f"{escape(str(made.folder))}")
    else:
        out.print(f"Use it: atoll login --kit {escape(str(made.folder))}")


@click.command("revoke")
@click.argument("project_dir", metavar="DIR/PROJECT", type=click.Path(path_type=Path))
@click.argument("name")
@click.option("--reason", type=click.Choice(list(REASONS)), default="unspecified",
              show_default=True, help="The reason recorded in the revocation list.")
@format_option
def revoke_command(project_dir: Path, name: str, reason: str, fmt: str) -> None:
    """Revoke NAME's certificate (a user or a site) in the project's revocation list.

    Writes DIR/PROJECT/ca/crl.pem with a new, higher number. Nothing changes in the federation
    until it is pushed: `atoll crl push DIR/PROJECT/ca/crl.pem`."""
    from atoll.pki.revoke import revoke

    done = _guarded(lambda: revoke(project_dir, name, reason))
    if fmt == "json":
        emit({"name": done.name, "kind": done.kind, "serial": done.serial,
              "reason": done.reason, "crl": str(done.crl), "number": done.number,
              "revoked": done.revoked}, fmt)
        return
    out = _out()
    kind = "user" if done.kind == "admin" else done.kind
    out.print(f"Revoked the {kind} [bold]{escape(done.name)}[/] (serial {done.serial}, reason "
              f"{done.reason}).")
    out.print(f"{escape(str(done.crl))} is now revocation list {done.number} "
              f"({done.revoked} certificate{'s' if done.revoked != 1 else ''} revoked).")
    out.print("Push it to the server, which applies it at once and hands it to every site:\n"
              f"  atoll crl push {escape(str(done.crl))} --kit PROJECT_ADMIN_KIT")
