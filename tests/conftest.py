"""Shared fixtures: every test gets its own state folder and Jupyter folders, and the
session fails if any process we started outlives the tests.

Tests that start clusters use ``state_dir`` (sets ``CLOUDTIK_STATE_DIR``), ``settings``,
``manager`` (async core) or ``backend`` (sync, as the faces use it).  At the end of each test
every cluster of its state folder is brought down and its daemons are stopped; a node process
still alive after that fails the test.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import doc_examples  # imported (and assertion-rewritten) now, not at the session's end
import pytest
import schemathesis

from cloudtik_emulators.processes import (
    cloudtik_processes,
    describe,
    kill_all,
    stop_launcher,
)
from jupyter_cloudtik.core.settings import CloudTik, load_user_config


# pytest assertion-rewrites every module of a plugin's distribution when it is first
# imported, parsing its source with ``ast`` in whichever thread imports it; next to other
# threads compiling code (a server's templates, a hub), CPython 3.11.7 then fails with
# "AST constructor recursion depth mismatch" (gh-106905).  schemathesis imports most of
# itself lazily: its xdist hook at the session's end (the run ended in a traceback), and
# loading an OpenAPI document inside a hub test (a CI run failed
# test_stateful_workflows_through_the_sidekick_keep_users_apart so).  Every module of it
# is imported now, at collection, before any test starts a thread (about 1.3 s).
def _import_every_module(package) -> None:
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # reporting.allure needs allure, which we do not use
            # remembered as missing: a later import fails at once instead of parsing the
            # file again (the xdist hook imports reporting.allure at every session's end)
            sys.modules[info.name] = None  # type: ignore[assignment]


_import_every_module(schemathesis)

TEST_CONFIG = """
c.LocalProvider.terminate_grace = 2.0
c.CloudTik.reaper_interval = 0.5
"""


@pytest.fixture(scope="session", autouse=True)
def isolated_jupyter(tmp_path_factory, request) -> Path:
    """Private Jupyter config/data/runtime folders and daemons that linger only briefly."""
    base = tmp_path_factory.mktemp("cloudtik")
    env = {
        "JUPYTER_CONFIG_DIR": base / "jupyter-config",
        "JUPYTER_DATA_DIR": base / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": base / "jupyter-runtime",
        "IPYTHONDIR": base / "ipython",
    }
    saved = {k: os.environ.get(k) for k in [*env, "CLOUDTIK_LAUNCHER_IDLE",
                                             "CLOUDTIK_PROGRESS", "CLOUDTIK_STATE_DIR",
                                             "JUPYTER_PLATFORM_DIRS"]}
    for k, v in env.items():
        v.mkdir(parents=True, exist_ok=True)
        os.environ[k] = str(v)
    os.environ["CLOUDTIK_LAUNCHER_IDLE"] = "3"
    os.environ["CLOUDTIK_PROGRESS"] = "text"
    os.environ["CLOUDTIK_STATE_DIR"] = str(base / "default-state")
    os.environ["JUPYTER_PLATFORM_DIRS"] = "1"
    (env["JUPYTER_CONFIG_DIR"] / "jupyter_cloudtik_config.py").write_text(TEST_CONFIG)
    yield base
    leftovers = cloudtik_processes(base)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if leftovers:
        text = describe(leftovers)
        kill_all(leftovers)
        pytest.fail(f"processes left behind by the tests (now killed):\n{text}",
                    pytrace=False)
    asked = getattr(request.config, "cloudtik_end_checks", set())
    if asked:
        left = _worker_processes(str(tmp_path_factory.getbasetemp()))
        assert not left, (f"processes left behind ({', '.join(sorted(asked))}):\n"
                          + "\n".join(left))


def check_worker_processes_at_the_end(config: pytest.Config, why: str) -> None:
    """Ask for the whole worker's base folder to be checked once every session fixture is
    gone (``isolated_jupyter`` is set up first, so it is torn down last).  Kept on the
    config: this module may be imported twice (as pytest's conftest and as a module)."""
    if not hasattr(config, "cloudtik_end_checks"):
        config.cloudtik_end_checks = set()  # type: ignore[attr-defined]
    config.cloudtik_end_checks.add(why)  # type: ignore[attr-defined]


def _worker_processes(base: str) -> list[str]:
    """Processes (but this one and zombies) that name ``base`` or run in it, waited for
    up to 10 s to end."""
    import time

    import psutil

    def ours() -> list[str]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                    continue
                cmd = " ".join(p.info["cmdline"] or [])
                if base in cmd or (p.info["cwd"] or "").startswith(base):
                    found.append(f"{p.pid}: {cmd[:120]}")
            except (psutil.Error, OSError):
                continue
        return found

    time.sleep(0.5)
    left = ours()
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = ours()
    return left


def _down_everything(state_dir: Path) -> None:
    """Stop every cluster recorded in ``state_dir`` with the real core."""
    if not (state_dir / "state.db").exists():
        return
    from jupyter_cloudtik.clusters.manager import ClusterManager

    settings = CloudTik(config=load_user_config(), state_dir=str(state_dir))
    manager = ClusterManager(settings=settings)

    async def down_all() -> None:
        for info in manager.list():
            try:
                await manager.down(info.name)
            except Exception as e:  # report, then let the leftover check decide
                print(f"cleanup: down {info.name} failed: {e}", file=sys.stderr)

    asyncio.run(down_all())
    manager.store.close()


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setenv("CLOUDTIK_STATE_DIR", str(d))
    yield d
    _down_everything(d)
    stop_launcher(d)
    from jupyter_cloudtik.storage.mounts import stop_supervisor

    stop_supervisor(d)  # the storage mount daemon, if a test started one
    leftovers = cloudtik_processes(d)
    if leftovers:
        text = describe(leftovers)
        kill_all(leftovers)
        # daemons may still be exiting; node processes are a real leak
        nodes = [line for line in text.splitlines() if "launcher" not in line
                 and "reaper" not in line]
        if nodes:
            pytest.fail("node processes left behind:\n" + "\n".join(nodes), pytrace=False)


@pytest.fixture
def settings(state_dir) -> CloudTik:
    return CloudTik(config=load_user_config(), state_dir=str(state_dir))


@pytest.fixture
def manager(settings):
    from jupyter_cloudtik.clusters.manager import ClusterManager

    m = ClusterManager(settings=settings)
    yield m
    m.store.close()


@pytest.fixture
def backend(settings):
    from jupyter_cloudtik.clusters.client import CoreBackend

    b = CoreBackend(settings=settings)
    yield b
    b.runner.stop()


@pytest.fixture
def venv_bin() -> Path:
    """The folder with this interpreter's scripts (jupyter-cloudtik, dask, ...)."""
    return Path(sys.executable).parent


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (cloudtik_emulators.browser), one a module."""
    from cloudtik_emulators.browser import chromium

    with chromium() as b:
        yield b


# --- every runnable block of README.md and docs/*.md ran somewhere (tests/doc_examples.py) ---


def _whole_suite(session, distributed: bool = False) -> bool:
    """True when this session ran the whole suite: no paths, -k, -m, --deselect, --lf
    and no early stop.  CLOUDTIK_DOC_CHECK=1 forces the check, =0 turns it off."""
    forced = os.environ.get("CLOUDTIK_DOC_CHECK", "")
    if forced in ("0", "1"):
        return forced == "1"
    cfg = session.config
    tests = Path(__file__).resolve().parent
    args = [Path(str(cfg.rootpath), a.split("::")[0]).resolve() for a in cfg.args]
    return (args in ([], [tests]) and not cfg.option.keyword and not cfg.option.markexpr
            and not getattr(cfg.option, "deselect", None) and not getattr(cfg.option, "lf", False)
            and not session.shouldstop and not session.shouldfail
            and (distributed or session.testscollected > 0))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist the test processes share a folder of locks (_MachineShare); the
    workers inherit this environment when they start."""
    import tempfile

    global _LOCK_DIR
    if not hasattr(config, "workerinput") and "CLOUDTIK_TEST_LOCK_DIR" not in os.environ:
        _LOCK_DIR = tempfile.mkdtemp(prefix="cloudtik-test-locks-")
        os.environ["CLOUDTIK_TEST_LOCK_DIR"] = _LOCK_DIR


_LOCK_DIR = ""  # the lock folder this (controlling) process made, removed at its end


def pytest_unconfigure(config: pytest.Config) -> None:
    if _LOCK_DIR and not hasattr(config, "workerinput"):
        import shutil

        shutil.rmtree(_LOCK_DIR, ignore_errors=True)
        os.environ.pop("CLOUDTIK_TEST_LOCK_DIR", None)


_DOC_RECORDS: dict[str, int] = {}  # worker id -> doc blocks it reported (the controller)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A pytest-xdist worker ended: merge the doc blocks it ran (its ``workeroutput``)."""
    ran = (getattr(node, "workeroutput", None) or {}).get("doc_ran")
    if ran is not None:
        _DOC_RECORDS[node.gateway.id] = doc_examples.merge_ran(ran)


def pytest_sessionfinish(session, exitstatus):
    worker = getattr(session.config, "workerinput", None)
    if worker is not None:  # a worker: hand the record over (xdist sends workeroutput)
        session.config.workeroutput["doc_ran"] = doc_examples.ran_records()
    _share.release()
    if worker is not None:
        return
    distributed = bool(getattr(session.config.option, "numprocesses", None))
    if exitstatus not in (0, 1) or not _whole_suite(session, distributed):
        return

    missing = doc_examples.check_coverage()
    waiting = doc_examples.pending()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if waiting and reporter:
        reporter.write_line("")
        reporter.write_line(f"{len(waiting)} doc blocks are marked pending (not run by any "
                            "test yet):\n" + "\n".join(f"  {b.id}: {b.not_run}"
                                                       for b in waiting), yellow=True)
    if missing:
        skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
        strict = os.environ.get("CLOUDTIK_DOC_CHECK") == "1" or not skipped
        text = ("runnable code blocks of the docs that no test ran (run them from a test "
                "through tests/doc_examples.py, or give a reason with <!-- not-run: ... -->):\n"
                + "\n".join("  " + m for m in missing))
        workers = int(getattr(session.config.option, "numprocesses", None) or 0)
        silent = workers - len(_DOC_RECORDS) if distributed else 0
        if silent > 0 and os.environ.get("CLOUDTIK_DOC_CHECK") != "1":
            strict = False
            text += (f"\n(not failing: {silent} of {workers} test workers sent no record of "
                     f"the blocks they ran; records came from {sorted(_DOC_RECORDS) or 'none'})")
        elif not strict:
            text += (f"\n(not failing: {skipped} tests were skipped and may be the ones that "
                     "run them; CLOUDTIK_DOC_CHECK=1 makes this fail)")
        if reporter:
            reporter.write_line("")
            reporter.write_line(text, red=strict, yellow=not strict)
        else:
            print(text, file=sys.stderr)
        if strict:
            session.exitstatus = 1
# Two workers (pytest-xdist, `make test`): suites that drive one machine-wide service or a
# JVM each stay in one group, so Slurm (one slurmctld for the machine), the A-REX sites and
# the Spark clusters never run beside themselves; everything else spreads over both.
_GROUPS = (
    ("hpc", ("tests/hpc/", "tests/hub/test_hub_locations.py")),
    ("jvm", ("tests/test_spark.py", "tests/huaweicloud/test_spark_",
             "tests/server/test_spark_ui_browser.py")),
)


# tests/hpc modules that never start the machine's Slurm (the ``slurm`` fixture refuses
# them, see ``outside_the_slurm_group``): units of their own, so they run beside the
# Slurm group instead of after it.  The real A-REX module alone is ~500 s of the suite, and
# no other module starts an A-REX site, so it still never runs beside itself.
_OWN_UNITS = (
    "tests/hpc/test_hpc_arex.py", "tests/hpc/test_hpc_arc_emulator.py",
    "tests/hpc/test_hpc_checks_fail_closed.py", "tests/hpc/test_hpc_container.py",
    "tests/hpc/test_hpc_dask.py",
    "tests/hpc/test_hpc_kernel_records.py", "tests/hpc/test_hpc_kernel_sizes.py",
    "tests/hpc/test_hpc_kernel_transport.py",
    "tests/hpc/test_hpc_notebook_reader.py",
    "tests/hpc/test_hpc_notebook_shapes.py", "tests/hpc/test_hpc_provenance_loop.py",
    "tests/hpc/test_hpc_staging.py", "tests/hpc/test_ssh_tunnel_nodelay.py",
)


def _group_of(item: pytest.Item) -> str | None:
    path = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent.parent)
    return _group_of_module(path.as_posix())


def _group_of_module(rel: str) -> str | None:
    if rel in _OWN_UNITS:
        return None
    for name, prefixes in _GROUPS:
        if rel.startswith(prefixes):
            return name
    return None


def _scope_of(nodeid: str) -> str:
    """The unit of work a worker gets: a group of ``_GROUPS`` whole, else one module (its
    tests in order, its module fixtures made once)."""
    module = nodeid.split("::", 1)[0]
    return _group_of_module(module) or module


def outside_the_slurm_group() -> str | None:
    """The test being set up, if its module is not in the ``hpc`` group (whose modules
    share one worker, so the machine runs one Slurm): what the ``slurm`` fixture refuses,
    whether a test names it or reaches it through ``request.getfixturevalue``."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    module = current.split("::", 1)[0]
    if module and _group_of_module(module) != "hpc":
        return module
    return None


# Seconds each unit of work took (summed test durations from test-artifacts/junit.xml of a
# clean-clone CI run; scripts/unit_seconds.py prints this table from a junit file).  The
# units are handed out longest first: handed out by number of tests (pytest-xdist's
# default), the real A-REX module (few tests, ~500 s) could start last and run alone for
# minutes at the end.  A unit not listed counts one second per test.
_UNIT_SECONDS: dict[str, float] = {  # CI of 2026-12-05 (-n 4), units of 25 s and more
    "hpc": 1560,  # + kernels through the hub, %storage on the node, reconnect (12-06)
    "tests/hpc/test_hpc_arex.py": 820,  # + the built environment, the sweep and its cancel
    "tests/hpc/test_hpc_container.py": 60,
    "jvm": 294,
    "tests/huaweicloud/test_node_faults.py": 192,
    "tests/huaweicloud/test_workspace_faults.py": 169,
    "tests/huaweicloud/test_realistic.py": 165,
    "tests/hub/test_hub_docs_config.py": 125,
    "tests/hub/test_hub_browser.py": 112,
    "tests/huaweicloud/test_packages.py": 108,
    "tests/hub/test_hub_adaptive_usage.py": 102,
    "tests/chaos/test_server_crashes.py": 95,
    "tests/dask_gateway/test_dask_gateway_provider.py": 94,
    "tests/server/test_jobs_api.py": 92,
    "tests/hub/test_generated_attacks.py": 88,
    "tests/chaos/test_hub_service_crashes.py": 77,
    "tests/hub/test_egress_fairness.py": 73,
    "tests/hub/test_egress_workers.py": 25,  # five proxies with their workers (2026-12-06)
    "tests/test_doc_examples.py": 73,
    "tests/hub/test_hub_service.py": 69,
    "tests/hub/test_hub_huaweicloud.py": 69,
    "tests/hub/test_hub_ownership.py": 67,
    "tests/huaweicloud/test_cli_and_counts.py": 61,
    "tests/hpc/test_hpc_arc_emulator.py": 57,
    "tests/huaweicloud/test_kill_midway.py": 56,
    "tests/placement/test_placement_properties.py": 54,
    "tests/server/test_adaptive_handover.py": 51,
    "tests/hpc/test_hpc_dask.py": 50,
    "tests/test_cli.py": 49,
    "tests/server/test_newcomer_walkthrough.py": 48,
    "tests/server/test_adaptive.py": 45,
    "tests/server/test_schemathesis.py": 45,
    "tests/placement/test_zone_boot.py": 45,
    "tests/server/test_jobs_panel_browser.py": 44,
    "tests/server/test_gateway_dashboard_browser.py": 42,
    "tests/hub/test_hub_grants.py": 41,
    "tests/server/test_sweeps_panel_browser.py": 41,
    "tests/hub/test_hub_sweeps.py": 41,
    "tests/server/test_dashboard_proxy.py": 36,
    "tests/huaweicloud/test_boundary.py": 35,
    "tests/server/test_dashboard_browser.py": 35,
    "tests/server/test_packaging.py": 34,
    "tests/huaweicloud/test_dashboard.py": 33,
    "tests/huaweicloud/test_readme_walkthrough.py": 32,
    "tests/fuzz/test_fuzz_docs.py": 31,
    "tests/huaweicloud/test_agency_credentials.py": 29,
    "tests/test_magics.py": 27,
    "tests/storage/test_storage_docs.py": 27,
}


def _unit_weight(scope: str, tests: int) -> float:
    return _UNIT_SECONDS.get(scope, float(tests))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the units in the order they are handed out (longest first; the
    tests of a unit keep their order): every worker collects, and sorts, the same way."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    scopes = [_scope_of(it.nodeid) for it in items]
    counts: dict[str, int] = {}
    for sc in scopes:
        counts[sc] = counts.get(sc, 0) + 1
    first = {sc: i for i, sc in reversed(list(enumerate(scopes)))}
    key = {id(it): (-_unit_weight(sc, counts[sc]), first[sc])
           for it, sc in zip(items, scopes, strict=True)}
    items.sort(key=lambda it: key[id(it)])


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Units by ``_scope_of``, in the order the workers collected them (longest first, see
    ``pytest_collection_modifyitems``).  (pytest-xdist's own ``loadgroup`` renames node
    ids, which pytest 9 no longer lets it do, so its groups would be ignored.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # its reorder counts tests, not seconds

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

    return GroupScheduling(config, log)


# Modules that have the machine to themselves: Spark's JVMs start and notice lost workers on
# timers that a busy 2-core machine stretches (seen beside the other worker's tests), so
# while one of these runs the other worker waits between its tests. The wait happens before
# pytest-timeout starts its clock (the hook below runs outside its wrapper).


def _alone(item: pytest.Item) -> bool:
    return _group_of(item) == "jvm"


class _MachineShare:
    """A readers-writer lock across the test processes (flock): tests share the machine,
    an ``_ALONE`` module takes it whole.  A writer holds the gate too, so readers that
    arrive while it waits queue behind it instead of starving it."""

    def __init__(self) -> None:
        self._files: list[int] = []
        self.exclusive = False

    def _open(self, name: str) -> int:
        folder = Path(os.environ.get("CLOUDTIK_TEST_LOCK_DIR") or "/tmp")
        return os.open(str(folder / name), os.O_RDWR | os.O_CREAT, 0o600)

    def take(self, exclusive: bool) -> None:
        import fcntl

        if self._files:
            return
        gate, main = self._open("gate.lock"), self._open("machine.lock")
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if exclusive:
            self._files = [main, gate]
        else:
            fcntl.flock(gate, fcntl.LOCK_UN)
            os.close(gate)
            self._files = [main]
        self.exclusive = exclusive

    def release(self) -> None:
        for fd in self._files:
            os.close(fd)  # closing the last descriptor drops its flock
        self._files = []
        self.exclusive = False


_share = _MachineShare()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    alone = _alone(item)
    if _share.exclusive != alone:
        _share.release()
    _share.take(exclusive=alone)
    try:
        yield
    finally:
        same_module = nextitem is not None and _alone(nextitem) and nextitem.path == item.path
        if not (alone and same_module):
            _share.release()
