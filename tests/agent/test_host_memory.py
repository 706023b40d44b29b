"""`runtime.host_memory`: with `release` a worker's process gives freed activations back to the system, so its
resident memory follows what is in use; `keep` (the default) leaves glibc alone; `mimalloc` runs the process on that
allocator; the training numbers are the same with every setting. glibc's setting holds for a whole process, so
each case runs in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import THREADS, records, same_numbers, same_weights, write_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

FREED = """
import sys, torch
from hacrl.agent import host_memory

def rss_mib():
    return next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmRSS')) / 1024

changed = host_memory.apply(sys.argv[1])
torch.ones(2**21).add_(1)  # 8 MiB, freed at once: glibc's own threshold rises past the tensors that follow
big, small = [], []
for _ in range(128):  # an update's activations (2 MiB each), small tensors allocated among them and kept
    big.append(torch.ones(2**19).add_(1))
    small.append(torch.ones(256))
held = rss_mib()
big.clear()
print(changed, held, rss_mib())
"""


HUGE = """
import sys, torch
from hacrl.agent import host_memory

host_memory.apply(sys.argv[1])
x = torch.ones(16 * 2**20)  # 64 MiB
print(sum(int(x.split()[1]) for x in open('/proc/self/smaps') if x.startswith('AnonHugePages:')))
"""


THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
THP_BY_MADVISE = THP.is_file() and "[madvise]" in THP.read_text()
"""Huge pages where a program asks for them (`always` gives them to every large mapping, `never` to none)."""
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
"""A subprocess's environment without a huge-page setting this process may have taken from `release`."""


def freed(mode: str) -> tuple[bool, float, float]:
    out = subprocess.run([sys.executable, "-c", FREED, mode], capture_output=True, text=True, check=True).stdout
    changed, held, after = out.split()
    return changed == "True", float(held), float(after)


def test_release_gives_freed_activations_back_and_keep_leaves_glibc_alone():
    changed, held, after = freed("release")
    assert changed
    assert held - after > 200, (held, after)  # 256 MiB of tensors freed: the resident memory falls with them
    changed, held, after = freed("keep")
    assert not changed
    assert held - after < 50, (held, after)  # glibc's default: freed into its heap below the small ones, resident


def test_release_backs_large_tensors_by_huge_pages_where_the_kernel_allows_it():
    """A fresh mapping costs a fault per page touched: with `release` torch's large tensors ask for 2 MiB pages
    (`THP_MEM_ALLOC_ENABLE`), so an update's activations, mapped anew each micro-batch, cost 512 times fewer faults;
    `keep` leaves torch as it is."""
    if not THP.is_file() or "[never]" in THP.read_text():
        pytest.skip("this kernel gives no transparent huge pages")

    def huge_kib(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", HUGE, mode], capture_output=True, text=True, check=True,
                              env=CLEAN_ENV)  # fmt: skip
        return int(done.stdout.split()[-1])

    assert huge_kib("release") >= 32 * 1024  # most of the 64 MiB tensor in huge pages
    if THP_BY_MADVISE:  # (a kernel set to `always` backs every large mapping by huge pages)
        assert huge_kib("keep") < 8 * 1024


@pytest.mark.slow
@pytest.mark.longest(32)
def test_the_numbers_are_the_same_with_every_setting(tiny_agents, tmp_path, capsys):
    """`keep`, `release` and `mimalloc` train the same numbers and weights, each run in a process of its own, and
    each setting reaches the worker (trainer -> WorkerSpec -> AgentWorker) and takes effect there. With `mimalloc`
    `hacrl train` runs its own command again with the allocator preloaded (the process is the same: its output and
    exit status are the command's), and so does `hacrl plan --measure`, which runs steps in its own process. Called
    from Python in a process that does not run on mimalloc, the run stops before it starts, naming the fix."""
    from hacrl.tools.cli import main

    train = ("import sys, torch; from hacrl.agent import host_memory; from hacrl.tools.cli import main; "
             "rc = main(); x = torch.ones(16 * 2**20); huge = sum(int(l.split()[1]) for l in "
             "open('/proc/self/smaps') if l.startswith('AnonHugePages:')) >= 32 * 1024; "
             "print('released', host_memory.released(), 'huge', huge, 'mimalloc', host_memory.loaded()); "
             "raise SystemExit(rc)")  # fmt: skip
    runs = {}
    for mode in ("keep", "release", "mimalloc"):
        runs[mode] = tmp_path / mode
        cfg = write_config(tmp_path / f"{mode}.yaml", tiny_agents, ["llama", "qwen"], runs[mode],
                           runtime={"torch_threads": THREADS, "host_memory": mode},
                           scoring={"function": "tests.reward_fixtures:digits"})  # fmt: skip
        done = subprocess.run([sys.executable, "-c", train, "train", str(cfg)], capture_output=True, text=True,
                              env=CLEAN_ENV)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        _, released, _, huge, _, on_mimalloc = done.stdout.splitlines()[-1].split()
        assert (released, on_mimalloc) == (str(mode != "keep"), str(mode == "mimalloc")), done.stdout[-500:]
        if THP_BY_MADVISE and mode != "mimalloc":  # release's huge pages, set before the first tensor was allocated
            assert huge == str(mode == "release"), done.stdout[-500:]
    assert records(runs["keep"])[-1]["llama/optimizer_steps"] > 0
    for mode in ("release", "mimalloc"):
        same_numbers(records(runs[mode]), records(runs["keep"]))
        same_weights(runs[mode], runs["keep"], 2)
    measured = subprocess.run([sys.executable, "-m", "hacrl", "plan", str(tmp_path / "mimalloc.yaml"), "--measure"],
                              capture_output=True, text=True, env=CLEAN_ENV)  # fmt: skip
    assert measured.returncode == 0 and "llama" in measured.stdout, measured.stderr[-2000:]  # steps on mimalloc too
    assert main(["train", str(tmp_path / "mimalloc.yaml"), "trainer.output_dir=" + str(tmp_path / "in-process")]) == 2
    assert "does not run on mimalloc" in capsys.readouterr().err
    assert not (tmp_path / "in-process").exists()


def test_a_host_out_of_memory_names_release_unless_the_process_already_releases(monkeypatch):
    from hacrl.agent import guards, host_memory

    cpu = torch.device("cpu")
    error = RuntimeError("DefaultCPUAllocator: can't allocate memory")
    monkeypatch.setattr(host_memory, "_released", False)
    assert "runtime.host_memory=release" in guards.oom_message("qwen", 1, cpu, "the update", 2, error)
    monkeypatch.setattr(host_memory, "_released", True)
    message = guards.oom_message("qwen", 1, cpu, "the update", 2, error)
    assert "runtime.host_memory" not in message and "trainer.micro_batch_size" in message


MIMALLOC_FREED = """
import sys, time, torch
from hacrl.agent import host_memory

def rss_mib():
    return next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmRSS')) / 1024

changed = host_memory.apply('mimalloc')  # stops the process unless it runs on mimalloc
big, small = [], []
for _ in range(128):  # as FREED: 2 MiB activations with small tensors among them
    big.append(torch.ones(2**19).add_(1))
    small.append(torch.ones(256))
held = rss_mib()
big.clear()
for _ in range(40):  # mimalloc gives unused pages back some milliseconds later, as the process goes on allocating
    work = [torch.ones(1024) for _ in range(100)]
    time.sleep(0.05)
    if held - rss_mib() > 200:
        break
print(changed, held, rss_mib())
"""


def test_mimalloc_reuses_and_gives_back_freed_activations_where_it_is_preloaded():
    from hacrl.agent import host_memory as allocator

    env = allocator.preloaded(CLEAN_ENV)
    done = subprocess.run([sys.executable, "-c", MIMALLOC_FREED], capture_output=True, text=True, check=True, env=env)
    changed, held, after = done.stdout.split()
    assert changed == "True"
    assert float(held) - float(after) > 200, done.stdout  # 256 MiB freed among kept small tensors: given back
    # without the preload the setting stops the process with the fix (not a silent glibc run)
    done = subprocess.run([sys.executable, "-c", MIMALLOC_FREED], capture_output=True, text=True, env=CLEAN_ENV)
    assert done.returncode != 0
    assert "does not run on mimalloc" in done.stderr and f"LD_PRELOAD={allocator.library()}" in done.stderr
