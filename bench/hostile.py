"""A lead's `job list` while one site's certificate holds hundreds of silent streams (issue 20).

    .venv/bin/python -m bench.hostile [--calls 400] [--streams 200]     (make bench-hostile)
    .venv/bin/python -m bench.hostile attack KIT [--streams 200] [--summary FILE] [--progress FILE]

The bench provisions a project with two studies (alpha: site-1; beta: site-2 and its lead),
starts the real server parent and site-2's parent, and times the lead's `Session.list_jobs()`
(one Admin.Call over mutual TLS, 20 a second) on a quiet server and, in alternate blocks, while
a separate process (`attack`, with site-1's certificate) keeps `--streams` streams open and silent: half
`Admin.Submit` (the call that held every admin thread in the issue), half `Federation.Connect`
and `Federation.PushReply`; each stream is opened again about a second after it ends (0.5-1.5 s, as a client's retry with
jitter does). Under attack
the lead also submits a job and waits for it to complete. Writes a table into BENCHMARKS.md.

`attack` alone runs until SIGTERM, then writes what the server answered (status codes) to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ATTACK = [("Admin", "Submit"), ("Federation", "Connect"), ("Admin", "Submit"),
          ("Federation", "PushReply")]
CHANNELS = 4  # the streams go over this many TLS connections
LEAD, ADMIN = "lead@beta.org", "admin@bench.org"
TRAIN = ("import atoll.client as fl\nfl.init()\nwhile fl.is_running():\n"
         "    m = fl.receive()\n    if m is None:\n        break\n"
         "    fl.send(fl.Model(params=m.params, num_examples=1))\n")
APP_YAML = ("server:\n  workflow: scatter_gather\n  args: {num_rounds: 1}\n"
            "site:\n  script: train.py\n")


# -- the attacker --------------------------------------------------------------------------------
class SilentStreams:
    """`streams` calls opened with one kit's certificate that never send a message."""

    def __init__(self, kit_dir: Path, streams: int, reopen_s: float = 1.0):
        self.kit_dir, self.streams, self.reopen_s = kit_dir, streams, reopen_s
        self.codes: collections.Counter[str] = collections.Counter()
        self.open = self.max_open = self.opened = 0

    async def run(self, stop: asyncio.Event) -> None:
        import grpc

        from atoll.pki.kit import load_kit
        from atoll.pki.tls import channel_credentials
        from atoll.wire.grpc_setup import OPTIONS

        kit = load_kit(self.kit_dir)
        creds = channel_credentials(kit)
        options = [*OPTIONS, ("grpc.use_local_subchannel_pool", 1)]  # one connection each
        channels = [grpc.aio.secure_channel(kit.server_address, creds, options=options)
                    for _ in range(CHANNELS)]
        tasks = [asyncio.create_task(self._stream(channels[i % CHANNELS], *ATTACK[i % len(ATTACK)],
                                                  stop)) for i in range(self.streams)]
        await stop.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()

    async def _stream(self, channel, service: str, method: str, stop: asyncio.Event) -> None:
        import grpc

        from atoll.wire import rpc

        path = f"/{rpc.PACKAGE}.{service}/{method}"
        server_streams = rpc.SERVICES[service][method][3]

        async def silence():
            await stop.wait()
            return
            yield b""  # an async generator that sends nothing

        while not stop.is_set():
            self.opened += 1
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            try:
                if server_streams:
                    async for _ in channel.stream_stream(path)(silence()):
                        pass
                else:
                    await channel.stream_unary(path)(silence())
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            finally:
                self.open -= 1
            if not stop.is_set():
                self.codes[code] += 1
            try:  # as a client's retry does it: about reopen_s later, not all at once
                await asyncio.wait_for(stop.wait(), self.reopen_s * random.uniform(0.5, 1.5))
            except TimeoutError:
                pass

    def summary(self) -> dict:
        return {"streams": self.streams, "opened": self.opened, "max_open": self.max_open,
                "codes": dict(self.codes)}


def attack_main(kit: Path, streams: int, summary: Path | None,
                progress: Path | None = None) -> int:
    """Attack until SIGTERM; with ``progress``, the summary so far is rewritten there every
    0.2 s, so that a test can wait for the attack to be at full strength instead of guessing."""

    async def report(attacker: SilentStreams, stop: asyncio.Event) -> None:
        while not stop.is_set():
            partial = progress.with_suffix(".tmp")
            partial.write_text(json.dumps(attacker.summary()))
            partial.replace(progress)
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except TimeoutError:
                pass

    async def run() -> dict:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        attacker = SilentStreams(kit, streams)
        reporter = asyncio.create_task(report(attacker, stop)) if progress else None
        await attacker.run(stop)
        if reporter is not None:
            await reporter
        return attacker.summary()

    result = asyncio.run(run())
    text = json.dumps(result)
    if summary is not None:
        summary.write_text(text)
    print(text)
    return 0


class Attacker:
    """The attack as a process of its own (its CPU is not the measuring process's)."""

    def __init__(self, kit: Path, streams: int, work: Path):
        self.summary_file = work / "attack.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.hostile", "attack", str(kit), "--streams",
             str(streams), "--summary", str(self.summary_file)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(work / "attack.log", "ab"))  # noqa: SIM115

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        return json.loads(self.summary_file.read_text())


# -- the bench -----------------------------------------------------------------------------------
def provision(work: Path) -> Path:
    import socket

    from atoll.pki.project import parse_project
    from atoll.pki.provision import provision as make_kits

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    project = parse_project({
        "name": "hostile", "server": {"name": "server", "host": "127.0.0.1", "port": port},
        "sites": [{"name": "site-1", "org": "org-1"}, {"name": "site-2", "org": "org-2"}],
        "users": [{"name": ADMIN, "org": "bench", "role": "project_admin"},
                  {"name": LEAD, "org": "org-2", "role": "lead"}],
        "studies": {"alpha": {"sites": ["site-1"]},
                    "beta": {"sites": ["site-2"], "admins": [LEAD]}},
    }, "bench")
    kits = make_kits(project, work).project_dir
    (kits / "site-2" / "local" / "study_runtime.yaml").write_text(
        "format_version: 2\nstudies:\n  beta: {}\n")
    return kits


def start(kits: Path, role: str, name: str, work: Path) -> subprocess.Popen:
    ready = work / f"{name}.ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "atoll", role, "start", str(kits / name), "--ready-file",
         str(ready)], stdout=open(work / f"{name}.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.stat().st_size):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start; see {work / (name + '.log')}")
        time.sleep(0.05)
    return proc


def job(folder: Path) -> Path:
    (folder / "app").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"name": folder.name,
                                                  "deploy_map": {"app": ["@ALL"]}}))
    (folder / "app" / "app.yaml").write_text(APP_YAML)
    (folder / "app" / "train.py").write_text(TRAIN)
    return folder


def latencies(session, calls: int, rate_hz: float = 20.0) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        session.list_jobs()
        out.append(time.perf_counter() - t0)
        time.sleep(max(0.0, 1.0 / rate_hz - out[-1]))
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def measure(calls: int, streams: int, work: Path, blocks: int = 2) -> dict:
    from atoll.admin.session import Session

    kits = provision(work)
    procs = [start(kits, "server", "server", work), start(kits, "site", "site-2", work)]
    try:
        with Session(kits / LEAD, study="beta") as lead:
            deadline = time.monotonic() + 30
            while not all(s["online"] for s in lead.sites()["sites"]):
                if time.monotonic() > deadline:
                    raise RuntimeError("site-2 did not come online")
                time.sleep(0.1)
            first = lead.submit(job(work / "warm-up"), wait=True, timeout=120)
            assert first["state"] == "FINISHED:COMPLETED", first
            server = procs[0].pid
            quiet, loud, cpu, codes, opened = [], [], [0.0, 0.0, 0.0, 0.0], {}, 0
            # quiet and attacked blocks in turn: both see the same load of a shared machine
            for block in range(blocks):
                t0, c0 = time.monotonic(), cpu_s(server)
                quiet += latencies(lead, calls // blocks)
                cpu[0] += cpu_s(server) - c0
                cpu[1] += time.monotonic() - t0
                attacker = Attacker(kits / "site-1", streams, work)
                try:
                    time.sleep(3.0)  # every stream opened and refused or held
                    t0, c0 = time.monotonic(), cpu_s(server)
                    loud += latencies(lead, calls // blocks)
                    cpu[2] += cpu_s(server) - c0
                    cpu[3] += time.monotonic() - t0
                    if block == blocks - 1:
                        under = lead.submit(job(work / "under-attack"), wait=True, timeout=120)
                finally:
                    attack = attacker.stop()
                opened += attack["opened"]
                for code, count in attack["codes"].items():
                    codes[code] = codes.get(code, 0) + count
    finally:
        for proc in procs[::-1]:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return {"quiet": quiet, "attack": loud, "job": under["state"],
            "attacker": {"opened": opened, "codes": codes},
            "cpu": (cpu[0] / cpu[1], cpu[2] / cpu[3])}


def table(result: dict, command: str, streams: int) -> str:
    quiet, loud = result["quiet"], result["attack"]
    codes = ", ".join(f"{k} {v}" for k, v in sorted(result["attacker"]["codes"].items()))
    ratio = p99(loud) / p99(quiet)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {when} on this machine ({os.cpu_count()} CPUs, shared), one run of:", "",
        f"    {command}", "",
        "| lead's `job list` (Session.list_jobs, 20 a second) | calls | median | p99 | "
        "server parent CPU |",
        "| --- | --- | --- | --- | --- |",
        f"| quiet server | {len(quiet)} | {statistics.median(quiet) * 1e3:.1f} ms | "
        f"{p99(quiet) * 1e3:.1f} ms | {result['cpu'][0]:.0%} |",
        f"| {streams} silent streams with site-1's certificate | {len(loud)} | "
        f"{statistics.median(loud) * 1e3:.1f} ms | {p99(loud) * 1e3:.1f} ms | "
        f"{result['cpu'][1]:.0%} |", "",
        f"p99 under attack / quiet p99: {ratio:.2f}× (target: at most 3×). A job the lead "
        f"submitted under attack ended {result['job']}. What the server answered the "
        f"attacker's {result['attacker']['opened']} calls: {codes}.", "",
        "Quiet and attacked blocks of 200 calls alternate (two of each), so that both see the "
        "same load of this shared machine. The attacker is its own process: half its streams are `Admin.Submit` (refused at once: "
        "a site certificate), half `Federation.Connect`/`PushReply` (64 admitted, the most one "
        "certificate may hold; each ended after 10 s of silence; the rest refused at once), each "
        "opened again 0.5-1.5 s after it ended. The lead is in another study (beta, site-2).",
    ]
    return "\n".join(lines)


def write_section(text: str, name: str = "hostile") -> None:
    path = ROOT / "BENCHMARKS.md"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = path.read_text()
    block = f"{begin}\n{text}\n{end}"
    if begin in body and end in body:
        body = body[:body.index(begin)] + block + body[body.index(end) + len(end):]
    else:
        body = body.rstrip() + f"\n\n## Hostile peers (issue 20)\n\n{block}\n"
    path.write_text(body)


def main(argv: list[str]) -> int:
    if argv[:1] == ["attack"]:
        parser = argparse.ArgumentParser(prog="bench.hostile attack")
        parser.add_argument("kit", type=Path)
        parser.add_argument("--streams", type=int, default=200)
        parser.add_argument("--summary", type=Path)
        parser.add_argument("--progress", type=Path)
        args = parser.parse_args(argv[1:])
        return attack_main(args.kit, args.streams, args.summary, args.progress)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="atoll-hostile-") as tmp:
        result = measure(args.calls, args.streams, Path(tmp))
    command = "make bench-hostile" if (args.calls, args.streams) == (400, 200) else \
        f".venv/bin/python -m bench.hostile --calls {args.calls} --streams {args.streams}"
    text = table(result, command, args.streams)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
