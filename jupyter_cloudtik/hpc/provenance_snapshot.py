"""The job-side half of a provenance record: the snapshot a job's own script takes of its
folder before the notebook runs (inputs, notebook, interpreter, packages) and after
(outputs), with the job's interpreter, into ``.cloudtik/prov-{before,after}.json``; and
the same package listing for this session."""

from __future__ import annotations

from typing import Any

from .base import MARKER_DIR, shell_quote

BEFORE, AFTER = "prov-before.json", "prov-after.json"

# what the job's script runs (with the job's interpreter, in the job's folder): hashes
# every file but the scaffolding; before the run also the interpreter and its packages
_SNAPSHOT_FUNCTION = r"""
def snapshot(phase, out):
  import hashlib, json, os, platform, socket, time
  files = {}
  for root, dirs, names in os.walk('.'):
      if root == '.':
          dirs[:] = [d for d in dirs if d != '.cloudtik']
      for n in names:
          p = os.path.join(root, n)[2:]
          if root == '.' and n in ('job.sh', 'job.log'):
              continue
          h = hashlib.sha256()
          try:
              with open(p, 'rb') as f:
                  for b in iter(lambda: f.read(1 << 20), b''):
                      h.update(b)
              files[p] = [h.hexdigest(), os.path.getsize(p)]
          except OSError:
              pass
  rec = {'time': time.time(), 'files': files}
  if phase == 'before':
      rec.update(python=platform.python_version(), implementation=platform.python_implementation(),
                 platform=platform.platform(), hostname=socket.gethostname())
      rec['packages'] = packages()
  with open(out + '.tmp', 'w') as f:
      json.dump(rec, f)
  os.replace(out + '.tmp', out)
"""


# installed packages by their metadata folders' names (``name-version.dist-info``): a
# directory listing per path entry, not a parse of every METADATA file (1 s for 250)
_PACKAGES = r"""
def packages(path=None):
    import os, re, sys
    found = {}
    for entry in (sys.path if path is None else path):
        if not entry or not os.path.isabs(entry):
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for n in sorted(names):
            for ext in ('.dist-info', '.egg-info'):
                if n.endswith(ext):
                    name, sep, version = n[:-len(ext)].partition('-')
                    key = re.sub(r'[-_.]+', '-', name).lower()
                    if sep and key not in found:
                        found[key] = version.split('-py')[0]
    return found
"""
_SNAPSHOT_FUNCTION = _PACKAGES + _SNAPSHOT_FUNCTION
# a snapshot on its own (a command job: no Python of ours runs in it otherwise)
_SNAPSHOT = _SNAPSHOT_FUNCTION + "import sys\nsnapshot(sys.argv[1], sys.argv[2])\n"

# a notebook job: the snapshots are taken by the process that runs papermill, before and
# after it, not by two more interpreters (each ~50 ms of start-up and imports per job, 4%
# of a small sweep element's time: benchmarks/hpc_sweep.py).  A snapshot that fails never
# fails the job; the exit status is papermill_runner's (a failed cell 1, a dead kernel 138)
_NOTEBOOK_RUN = r"""
import sys, traceback
SNAPSHOT_FUNCTION
def _snap(phase, out):
    try:
        snapshot(phase, out)
    except Exception:
        pass
_snap('before', sys.argv[1])
_runner = {'__name__': 'ct_papermill_runner'}
exec(compile(RUNNER, 'papermill_runner.py', 'exec'), _runner)
_rc = 0
try:
    _runner['main'](sys.argv[3:])
except SystemExit as e:
    _rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
except BaseException:
    traceback.print_exc()
    _rc = 1
_snap('after', sys.argv[2])
sys.stdout.flush()
sys.stderr.flush()
sys.exit(_rc)
"""
_namespace: dict[str, Any] = {}
exec(_PACKAGES, _namespace)  # the same function for this session (no second copy)


def snapshot_line(run: str, phase: str) -> str:
    """The job-script line that records the ``phase`` (``before``/``after``) snapshot;
    its failure (no Python in an image, say) never fails the job."""
    name = BEFORE if phase == "before" else AFTER
    return (
        f'{run} "$CT_PYTHON" -c {shell_quote(_SNAPSHOT)} {phase} '
        f"{MARKER_DIR}/{name} >/dev/null 2>&1 || true"
    )


def notebook_run_line(run: str, runner_source: str, args: str) -> str:
    """The job-script line that takes the before snapshot, runs ``runner_source``
    (papermill_runner's text) with ``args`` (IN OUT PARAMETERS KERNEL CWD, quoted) and
    takes the after snapshot, in one interpreter; its exit status is the run's."""
    code = (_NOTEBOOK_RUN.replace("SNAPSHOT_FUNCTION", _SNAPSHOT_FUNCTION)
            .replace("RUNNER", repr(runner_source)))
    return (f'{run} "$CT_PYTHON" -c {shell_quote(code)} {MARKER_DIR}/{BEFORE} '
            f"{MARKER_DIR}/{AFTER} {args}")


def session_packages() -> dict[str, str]:
    """This session's installed packages (normalized name -> version), read as a job's
    snapshot reads its own."""
    return _namespace["packages"]()
