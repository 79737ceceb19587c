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
_SNAPSHOT = r"""
import hashlib, json, os, platform, socket, sys, time
phase, out = sys.argv[1], sys.argv[2]
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
PACKAGES_CODE
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
_SNAPSHOT = _SNAPSHOT.replace("PACKAGES_CODE", _PACKAGES)
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


def session_packages() -> dict[str, str]:
    """This session's installed packages (normalized name -> version), read as a job's
    snapshot reads its own."""
    return _namespace["packages"]()
