"""Every coverage-guided fuzz target in fuzz/ (atheris) runs for a short bounded time.

Each target replays its committed seeds first (fuzz/corpus/NAME: realistic inputs and every
input that once broke a property), then mutates them for ``RUNS`` inputs or until
``SECONDS`` (plus ``STARTUP``) have passed; a broken property (an
unexpected exception, a wrong round trip) fails the test with the target's traceback and the
input, written as ``crash-*`` under the test's tmp folder.  Two targets run at a time (the
suite runs on 2 cores).  Longer campaigns: docs/security.md#fuzzing.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
sys.path.insert(0, str(FUZZ))
import run as fuzz_run  # noqa: E402  (fuzz/run.py)

SECONDS = 2  # of mutation per target, after its seeds
MIN_RUNS = 200  # fewer inputs tried means the target is not fuzzing anything
# libFuzzer counts -max_total_time from the process's start, imports included: on the
# loaded CI machine rest_body's imports (and their instrumentation) took most of its 2 s
# once and it tried 12 inputs in 7.8 s.  So each target gets STARTUP more seconds, and
# stops after RUNS inputs (about 0.4 s of fuzzing here, quiet) if that comes first
STARTUP = 10
RUNS = 20_000


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[int, str, float, Path]]:
    base = tmp_path_factory.mktemp("fuzz")

    def one(name: str):
        artifacts = base / f"{name}-artifacts"
        artifacts.mkdir()
        rc, log, took = fuzz_run.run_target(name, SECONDS + STARTUP, base / f"{name}-corpus",
                                            artifacts, runs=RUNS)
        return name, (rc, log, took, artifacts)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, fuzz_run.TARGETS))


def test_every_target_is_run():
    names = {p.stem[len("fuzz_"):] for p in FUZZ.glob("fuzz_*.py")}
    assert set(fuzz_run.TARGETS) == names
    assert len(names) >= 10
    for name in names:  # each has seeds, so its first inputs reach the parsers
        assert list((FUZZ / "corpus" / name).iterdir()), name


@pytest.mark.parametrize("name", fuzz_run.TARGETS)
def test_target_keeps_its_properties(results, name):
    rc, log, took, artifacts = results[name]
    if rc != 0:
        start = log.find("=== Uncaught Python exception")
        crashes = sorted(p.name for p in artifacts.iterdir())
        pytest.fail(f"fuzz target {name} broke a property (inputs: {crashes} in "
                    f"{artifacts}):\n{log[start:start + 4000] if start >= 0 else log[-4000:]}")
    runs = fuzz_run.executions(log)
    assert runs >= MIN_RUNS, f"{name}: only {runs} inputs in {took:.1f}s"
