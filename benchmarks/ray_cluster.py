"""Cluster rehearsal on one machine: a Ray head and a second Ray node on loopback, a hacrl run that joins them, then
both nodes stopped.

    python benchmarks/ray_cluster.py                       # the demo's agents, 2 steps, one agent per node
    python benchmarks/ray_cluster.py CONFIG [key=value ...]

What it does, as a user would on a real cluster (docs/design.md, "Two backends"):
    RAY_AUTH_MODE=token ray start --head --port P --num-cpus 1 ...       (node 1)
    RAY_AUTH_MODE=token ray start --address 127.0.0.1:P --num-cpus 1 ... (node 2)
    hacrl train CONFIG runtime.backend=ray runtime.ray.address=127.0.0.1:P
and then stops exactly the Ray processes it started (they carry a marker in their environment; `ray stop` would
stop every Ray on the machine). Each node offers one CPU and each agent asks for one, so Ray places one agent on
each node; the run prints where each agent ran. Exit status: the training run's.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray() -> str:
    return str(Path(sys.executable).with_name("ray"))


def marked_processes(marker: str) -> list[int]:
    """Processes whose environment holds HACRL_RAY_REHEARSAL=<marker>: the Ray nodes this rehearsal started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if f"HACRL_RAY_REHEARSAL={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def stop(marker: str, grace: float = 10.0) -> None:
    """SIGTERM every process of the rehearsal's nodes, then SIGKILL what is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in marked_processes(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not marked_processes(marker):
            return


def _forget_cluster(port: int) -> None:
    """Remove Ray's note of the latest cluster if it is ours (as `ray stop` does), so no later `ray.init()` tries
    to join a cluster that is gone."""
    note = Path("/tmp/ray/ray_current_cluster")
    try:
        if note.read_text().strip().endswith(f":{port}"):
            note.unlink()
    except OSError:
        pass


def rehearse(config: str, overrides: list[str], *, log=print, cpus_per_node: int = 1, train_prefix=()) -> int:
    """Two nodes of `cpus_per_node` (logical) CPUs each, the run, both nodes stopped; the run's exit status.
    `train_prefix`: a command the training run is started under (e.g. /usr/bin/time for its peak memory)."""
    port, marker = _free_port(), secrets.token_hex(6)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "HACRL_RAY_REHEARSAL": marker}
    node = ["--num-cpus", str(cpus_per_node), "--object-store-memory", "100000000", "--disable-usage-stats"]
    commands = [
        [_ray(), "start", "--head", "--port", str(port), "--include-dashboard=false", *node],
        [_ray(), "start", "--address", f"127.0.0.1:{port}", *node],
    ]
    try:
        for command in commands:
            log("$ " + " ".join(command[1:]))
            subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=120)
        train = [*train_prefix, sys.executable, "-m", "hacrl", "train", config, *overrides]
        train += ["runtime.backend=ray", f"runtime.ray.address=127.0.0.1:{port}"]
        log("$ hacrl " + " ".join(train[len(train_prefix) + 3 :]))
        done = subprocess.run(train, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        log(done.stdout[-3000:] + done.stderr[-3000:])
        log("\n".join(x for x in done.stdout.splitlines() if x.startswith("ray: ")))  # where each agent ran, whole
        return done.returncode
    finally:
        stop(marker)
        _forget_cluster(port)
        left = marked_processes(marker)
        log(f"stopped both Ray nodes ({'all processes gone' if not left else f'{len(left)} left: {left}'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/demo.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    overrides = args.overrides or ["trainer.steps=2", "eval.at_start=false", "trainer.output_dir=runs/ray-cluster"]
    if args.config == "configs/demo.yaml" and not (ROOT / ".cache/demo-agents/llama-char/config.json").is_file():
        print("bootstrap the demo agents first: hacrl bootstrap", file=sys.stderr)
        return 2
    return rehearse(args.config, overrides)


if __name__ == "__main__":
    raise SystemExit(main())
