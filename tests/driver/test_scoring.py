"""Scoring processes: a time limit no reward function can get past, the same rewards as in-process scoring, and
clear errors for user functions that misbehave."""

from __future__ import annotations

import math
import os
import time
import warnings

import pytest

from hacrl.config import ScoringConfig
from hacrl.driver.scoring import Scorer
from hacrl.errors import HacrlWarning, RewardError
from hacrl.tasks.rewards import MathReward, import_reward_function

FIX = "tests.reward_fixtures"


def _user(name: str, **settings) -> Scorer:
    return Scorer(f"{FIX}:{name}", ScoringConfig(**settings), builtin=False)


@pytest.mark.slow
def test_a_user_function_that_never_returns_is_stopped_and_only_its_samples_time_out():
    scorer = _user("hangs_on_hang", timeout=1.0, workers=2)
    texts = ["a", "hang", "b", "c", "d", "hang"]
    try:
        with pytest.warns(HacrlWarning, match="tests.reward_fixtures:hangs_on_hang ran past scoring.timeout=1s"):
            start = time.perf_counter()
            result = scorer.score(["p"] * 6, texts, {})
            seconds = time.perf_counter() - start
        assert result.rewards == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
        assert result.timeouts == [1, 5] and result.errors == []
        # per worker: its slice's batch budget (3 x 1 s), then one completion at a time (1 s for the hanging one)
        assert seconds < 3 + 1 + 10
        assert scorer.score(["p"], ["fine"], {}).rewards == [1.0]  # fresh processes took over
    finally:
        scorer.close()


@pytest.mark.slow
def test_a_timeout_scores_reward_on_timeout_or_stops_the_run():
    scorer = _user("hangs_on_hang", timeout=0.5, on_timeout=0.25)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HacrlWarning)
            assert scorer.score(["p", "p"], ["hang", "ok"], {}).rewards == [0.25, 1.0]
    finally:
        scorer.close()
    stopping = _user("hangs_on_hang", timeout=0.5, stop_on_timeout=True)
    with pytest.raises(RewardError, match="ran past scoring.timeout=0.5s on sample 0 .*stop_on_timeout"):
        stopping.score(["p"], ["hang"], {})
    stopping.close()


@pytest.mark.slow
def test_the_warning_names_a_function_that_keeps_timing_out_at_1_10_100_timeouts():
    scorer = _user("hangs_on_hang", timeout=0.2, on_hung="continue")  # every text hangs it: hung, but go on
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                scorer.score(["p"] * 5, ["hang"] * 5, {})  # 5, 10, 15 timeouts so far
        messages = [str(w.message) for w in caught if issubclass(w.category, HacrlWarning)]
        assert len(messages) == 2 and "on 5 completion(s)" in messages[0] and "on 10 completion(s)" in messages[1]
        assert scorer.total_timeouts == 15
    finally:
        scorer.close()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("exits_on_boom", "process of reward function tests.reward_fixtures:exits_on_boom died \\(exit status 3"),
        ("numeric_strings", "returned '1.0' \\(str\\) for sample 0"),
        ("a_dict", "must return a list of 3 floats, got dict"),
        ("raises_on_x", "raised KeyError: 'oops' at reward_fixtures.py:\\d+ \\(while scoring samples 0-2"),
    ],
)
def test_a_misbehaving_user_function_stops_the_run_naming_function_and_sample(name, message):
    scorer = _user(name)
    with pytest.raises(RewardError, match=message):
        scorer.score(["p"] * 3, ["x", "boom", "y"], {})
    scorer.close()


def test_a_user_function_that_cannot_be_imported_fails_before_any_scoring(tmp_path, monkeypatch):
    (tmp_path / "broken_rewards.py").write_text("def f(prompts, completions:\n    return []\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RewardError, match="cannot import module 'broken_rewards' \\(SyntaxError"):
        import_reward_function("broken_rewards:f")


def test_a_reward_module_in_the_working_directory_imports_like_under_python_m(tmp_path, monkeypatch):
    """The `hacrl` console script does not put the working directory on sys.path (`python -m hacrl` does)."""
    import sys

    (tmp_path / "cwd_rewards.py").write_text("def f(prompts, completions, **kw):\n    return [1.0] * len(completions)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    scorer = Scorer("cwd_rewards:f", ScoringConfig(), builtin=False)
    try:
        assert scorer.score(["p", "q"], ["a", "b"], {}).rewards == [1.0, 1.0]
    finally:
        scorer.close()


@pytest.mark.slow
def test_rewards_do_not_depend_on_the_number_of_workers_or_on_isolation():
    golds = [str(i % 7) for i in range(40)]
    texts = [f"work\nanswer: {i % 5}" if i % 3 else f"\\boxed{{{i % 7}}}" for i in range(40)]
    results = []
    for workers, isolation in ((1, "process"), (3, "process"), (1, "inline")):
        scorer = Scorer(MathReward(), ScoringConfig(workers=workers, isolation=isolation), builtin=True)
        results.append(scorer.score([""] * 40, texts, {"answer": golds}).rewards)
        scorer.close()
    in_process = MathReward()([""] * 40, texts, golds)
    assert results[0] == results[1] == results[2] == in_process
    assert 0 < sum(in_process) < 40


def test_a_user_function_gets_contiguous_slices_in_order():
    scorer = _user("batch_position", workers=2)
    try:
        assert scorer.score(["p"] * 5, list("abcde"), {}).rewards == [0.0, 0.01, 0.02, 0.0, 0.01]
    finally:
        scorer.close()


def test_the_gold_answer_is_parsed_once_not_once_per_completion(monkeypatch):
    import math_verify

    calls: list[str] = []
    real_parse = math_verify.parse

    def counting_parse(text, *args, **kwargs):
        calls.append(text)
        return real_parse(text, *args, **kwargs)

    monkeypatch.setattr(math_verify, "parse", counting_parse)
    gold = "1" + "0" * 2000
    reward = MathReward()
    assert reward([""] * 20, [f"\\boxed{{{i}}}" for i in range(20)], [gold] * 20) == [0.0] * 20
    assert sum(text == f"\\boxed{{{gold}}}" for text in calls) == 1


def test_scorer_processes_have_a_memory_limit():
    scorer = Scorer(f"{FIX}:digits", ScoringConfig(memory_mb=512), builtin=False).start()
    try:
        scorer.score(["p"], ["1"], {})
        from hacrl.driver.supervision import descendants

        (pid,) = descendants(scorer._workers[0].process.pid)  # the scoring process, below its keeper
        limits = open(f"/proc/{pid}/limits").read()
        line = next(x for x in limits.splitlines() if x.startswith("Max address space"))
        assert str(512 * 1024 * 1024) in line
    finally:
        scorer.close()


def test_reward_values_are_checked_the_same_way_in_and_out_of_process():
    from hacrl.tasks.rewards import validate_rewards

    assert validate_rewards("f", [True, 0, 0.5], ["a", "b", "c"], r_max=1.0) == [1.0, 0.0, 0.5]
    for bad in ("1.0", None, math.inf, -0.1, b"1"):
        with pytest.raises(RewardError, match="rewards must be finite numbers"):
            validate_rewards("f", [bad], ["a"], r_max=1.0)


@pytest.mark.slow
def test_a_hung_user_function_stops_within_its_limits_naming_the_knobs():
    """Past its limit on the whole slice (8 x 0.5 s), then on each of the first 3 completions retried alone: hung.
    The run stops instead of scoring every completion reward_on_timeout twice over (the measured case: 503 s of
    zero rewards for a 2-step tiny run)."""
    scorer = _user("sleeps_forever", timeout=0.5)
    start = time.perf_counter()
    expected = (
        r"sleeps_forever is hung: its call on a slice of 8 completion\(s\) ran past 4s, then it ran past "
        r"scoring.timeout=0.5s on each of the first 3 .*scoring.on_hung=continue"
    )
    with pytest.raises(RewardError, match=expected):
        scorer.score(["p"] * 8, ["a"] * 8, {})
    assert time.perf_counter() - start < 4 + 3 * 0.5 + 5  # + process restarts
    scorer.close()


@pytest.mark.slow
def test_with_reward_on_hung_continue_a_hung_function_scores_reward_on_timeout_each_once():
    scorer = _user("sleeps_forever", timeout=0.3, on_timeout=0.25, on_hung="continue")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HacrlWarning)
            start = time.perf_counter()
            result = scorer.score(["p"] * 4, ["a"] * 4, {})
        assert result.rewards == [0.25] * 4 and result.timeouts == [0, 1, 2, 3]
        assert time.perf_counter() - start < 4 * 0.3 + 4 * 0.3 + 6  # the slice's call, then each once (+ restarts)
    finally:
        scorer.close()


@pytest.mark.slow
def test_a_function_that_hangs_on_some_texts_only_is_not_hung():
    """hangs_on_hang returns for most texts: its first retried completions score, so the run goes on."""
    scorer = _user("hangs_on_hang", timeout=0.3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HacrlWarning)
            result = scorer.score(["p"] * 4, ["ok", "hang", "hang", "hang"], {})
        assert result.rewards == [1.0, 0.0, 0.0, 0.0] and result.timeouts == [1, 2, 3]
    finally:
        scorer.close()


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = open(f"/proc/{entry.name}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if cmdline[:2] == [b"sleep", marker.encode()]:
                found.append(int(entry.name))
    return found


def _gone(marker: str, seconds: float = 5.0) -> bool:
    """No process with `marker` left within `seconds`."""
    deadline = time.monotonic() + seconds
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _processes_with(marker) == []


def test_a_timed_out_functions_own_subprocesses_are_killed_with_it():
    marker = f"{os.getpid() % 1000 + 7000}.25"
    scorer = _user("hangs_with_a_child", timeout=0.5, on_hung="continue")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HacrlWarning)
            scorer.score(["p"], ["a"], {"marker": [marker]})
        assert _gone(marker)
    finally:
        scorer.close()


def test_a_scoring_process_that_died_while_idle_is_replaced_on_the_next_call():
    import signal

    scorer = _user("digits").start()
    try:
        assert scorer.score(["p"], ["12"], {}).rewards == [0.5]
        process = scorer._workers[0].process
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        assert scorer.score(["p"], ["1234"], {}).rewards == [1.0]  # no BrokenPipeError
    finally:
        scorer.close()


def test_a_scoring_process_killed_under_its_keeper_is_replaced_without_a_traceback(capfd):
    """kill -9 of the scoring process itself (below its keeper): the keeper ends the same way. It tried to set a
    handler for SIGKILL to do so, which raised EINVAL: a traceback on the run's stderr (found by the chaos soak)."""
    import signal

    from hacrl.driver.supervision import descendants

    scorer = _user("digits").start()
    try:
        assert scorer.score(["p"], ["12"], {}).rewards == [0.5]
        keeper = scorer._workers[0].process
        (child,) = descendants(keeper.pid)
        os.kill(child, signal.SIGKILL)
        assert keeper.wait(timeout=10) == -signal.SIGKILL
        assert scorer.score(["p"], ["1234"], {}).rewards == [1.0]
    finally:
        scorer.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Invalid argument" not in err, err


def test_a_scoring_process_killed_before_its_first_job_is_replaced():
    import signal

    scorer = _user("digits").start()  # the process imports its function in the background...
    try:
        os.kill(scorer._workers[0].process.pid, signal.SIGKILL)  # ...and is killed before any job
        assert scorer.score(["p", "q"], ["12", "1234"], {}).rewards == [0.5, 1.0]
    finally:
        scorer.close()


@pytest.mark.slow
def test_scoring_works_under_an_inherited_address_space_limit_below_memory_mb(tmp_path):
    """Issue 42: under `ulimit -v` below scoring.memory_mb each scoring process died raising its own limit (a
    process cannot raise its hard limit), and the message blamed the reward function. It keeps the lower limit."""
    import subprocess
    import sys

    script = tmp_path / "limited.py"
    script.write_text(
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3072 * 2**20, 3072 * 2**20))\n"
        "from hacrl.config import ScoringConfig\n"
        "from hacrl.tasks.rewards import MathReward\n"
        "from hacrl.driver.scoring import Scorer, address_space_note\n"
        "s = Scorer(MathReward(), ScoringConfig(memory_mb=4096, workers=1), builtin=True).start()\n"
        "print(s.score(['q'] * 2, ['\\\\boxed{2}', '\\\\boxed{3}'], {'answer': ['2', '2']}).rewards)\n"
        "s.close()\n"
        "print(address_space_note(4096))\n"
        "print(repr(address_space_note(2048)))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[1.0, 0.0]"
    assert "address-space limit of 3072 MiB inherited from the shell" in lines[1] and "ulimit -v" in lines[1]
    assert "scoring.memory_mb=4096" in lines[1] and lines[2] == "''"


@pytest.mark.slow
def test_a_detached_subprocess_of_a_reward_function_is_killed_too_and_does_not_ignore_term():
    """Issue 42: a child that called setsid survived the scoring process, and ignored SIGTERM (the scoring
    process's ignored signals were inherited). Now it stays below the scoring process (a subreaper), is killed
    with it, and a TERM from anyone reaches it."""
    import signal

    marker = f"{os.getpid() % 1000 + 8000}.75"
    scorer = _user("hangs_with_a_detached_child", timeout=1.0, on_hung="continue")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HacrlWarning)
            worker_started = time.monotonic()
            scorer.start()
            seen: list[int] = []
            ignored: list[int] = []

            def look() -> None:  # while the function hangs: the detached sleep exists; which signals it ignores
                while not seen and time.monotonic() < worker_started + 30:
                    for pid in _processes_with(marker):
                        try:
                            status = open(f"/proc/{pid}/status").read()
                        except OSError:
                            continue
                        seen.append(pid)
                        line = next(x for x in status.splitlines() if x.startswith("SigIgn"))
                        ignored.append(int(line.split()[1], 16))
                    time.sleep(0.05)

            import threading

            watcher = threading.Thread(target=look)
            watcher.start()
            scorer.score(["p"], ["a"], {"marker": [marker]})
            watcher.join()
        assert seen, "the reward function's detached child was never seen"
        assert not ignored[0] & (1 << (signal.SIGTERM - 1))
        assert _gone(marker)
    finally:
        scorer.close()
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)


# -- a user's reward module is code from elsewhere: imported only in the scoring processes, bounded there ------------

IMPORTS = {
    "blocks": ("import time\ntime.sleep(600)\n", "did not finish importing reward function planted_rewards:f within "
               "scoring.start_timeout=3s: its module blocks at import"),
    "raises": ("raise RuntimeError('no GPU here')\n", "could not load reward function planted_rewards:f: RewardError: "
               "scoring.function='planted_rewards:f': cannot import module 'planted_rewards' (RuntimeError: no GPU"),
    "sys.exit": ("import sys\nsys.exit(0)\n", "its module called sys.exit(0) while being imported"),
    "os._exit": ("import os\nos._exit(0)\n",
                 "exited while importing reward function planted_rewards:f (exit status 0)"),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", list(IMPORTS))
def test_a_reward_module_that_blocks_raises_or_exits_at_import_stops_the_run_naming_it(
    behaviour, tiny_agents, tmp_path, monkeypatch, capsys
):
    """Issue 61, 6 and 21: the trainer imported `scoring.function` itself, unbounded: a module that blocked at import
    hung `hacrl train` with no output, and one that called sys.exit(0) / os._exit(0) ended hacrl silently with that
    code. Now only the scoring processes import it; the run waits for them before step 1, at most
    `scoring.start_timeout`, and stops with one message naming the module. The module records who imported it."""
    import sys
    import time

    from tests.conftest import fails_cleanly, pair_config

    code, expected = IMPORTS[behaviour]
    importers = tmp_path / "importers"
    (tmp_path / "planted_rewards.py").write_text(
        f"import os\nopen({str(importers)!r}, 'a').write(f'{{os.getpid()}}\\n')\n{code}"
        "def f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    timeout = 3 if behaviour == "blocks" else 30  # the others fail at once: no wait on a loaded machine
    cfg = pair_config(tiny_agents, tmp_path, scoring={"function": "planted_rewards:f", "start_timeout": timeout})
    start = time.monotonic()
    fails_cleanly(capsys, ["train", str(cfg)], "reward error:", expected)
    assert time.monotonic() - start < 60
    assert "planted_rewards" not in sys.modules
    pids = {int(line) for line in importers.read_text().split()}
    assert pids and os.getpid() not in pids  # imported, and never by the trainer
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _sleeps(marker: str) -> list[int]:
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[:2] == [
                b"sleep",
                marker.encode(),
            ]:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_a_reward_functions_subprocesses_die_with_the_trainer_on_kill_9(tiny_agents, tmp_path):
    """Issue 61, 19: a reward function's subprocesses (here detached: setsid, then a shell that exits) outlived a
    trainer killed with SIGKILL: its scoring process died with it, and they were re-parented to init. Now the
    scoring process's keeper, their subreaper, sees the trainer gone and kills them."""
    import signal
    import time
    from pathlib import Path

    from tests import forked
    from tests.conftest import pair_config

    marker = f"{os.getpid() % 1000 + 9000}.5"
    (tmp_path / "spawning_rewards.py").write_text(
        "import subprocess\n"
        "def f(prompts, completions, **kw):\n"
        f"    subprocess.Popen(['sh', '-c', 'sleep {marker} &'], start_new_session=True).wait()\n"
        "    return [0.0] * len(completions)\n"
    )
    cfg = pair_config(tiny_agents, tmp_path, scoring={"function": "spawning_rewards:f"})
    done = forked.hacrl(["train", str(cfg)], {"HACRL_FAULTS": "scoring:1"}, cwd=tmp_path)  # SIGKILL after scoring
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert Path(tmp_path / "run").is_dir()
    deadline = time.monotonic() + 5
    while _sleeps(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _sleeps(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} subprocess(es) of the reward function outlived the trainer"


def test_a_scoring_process_and_its_keeper_ignore_sigint_and_sigterm():
    """docs/reliability.md: the trainer decides when scoring ends; a SIGINT or SIGTERM sent to a scoring process
    (or its keeper) does not break the step: the call returns every reward."""
    import signal

    from hacrl.driver.supervision import descendants

    scorer = _user("digits").wait_ready()
    try:
        keeper = scorer._workers[0].process.pid
        for pid in (keeper, *descendants(keeper)):
            for sig in (signal.SIGINT, signal.SIGTERM):
                os.kill(pid, sig)
        time.sleep(0.2)
        assert scorer.score(["p"] * 3, ["1", "22", "333"], {}).rewards == [0.25, 0.5, 0.75]
        assert scorer._workers[0].process.pid == keeper  # the same process: nothing was restarted
    finally:
        scorer.close()
