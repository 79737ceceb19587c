"""A container image for the ``container`` path of HPC jobs, built here with Podman.

No image registry is reachable from this machine, so the image is made locally: the
stock Debian root the realistic cloud servers boot from (``huaweicloud/image.py``:
``debootstrap --variant=minbase --include=python3``, Python 3.11, no pip) is imported
as a base image, and papermill and ipykernel — what a job's image must have — are
installed into it from wheels with pip run from its own wheel (as the environment build
on HPC systems does, hpc/environment.py), offline.  The image is kept in Podman's store
under ``RUNNER_IMAGE`` and rebuilt only when missing.

``site_containers_conf`` writes the containers.conf a site like this machine needs:
an OCI runtime that works on its hybrid cgroup hierarchy (crun refuses it, runc does
not) and default limits under the hard ones a container here may not raise (Podman's
own defaults ask for more and crun/runc fail with EPERM).  A site admin would put the
same in ``/etc/containers/containers.conf``; tests pass it to jobs as
``CONTAINERS_CONF`` through ``environment.variables``.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import uuid
from pathlib import Path

from .huaweicloud.image import ensure_image

RUNNER_IMAGE = "localhost/cloudtik-runner:bookworm"
BASE_IMAGE = "localhost/cloudtik-stock:bookworm"


class ContainerImageError(RuntimeError):
    pass


def podman_missing() -> str | None:
    """Why Podman images cannot be built and run here, or None."""
    if os.geteuid() != 0:
        return "the test image is built as root (podman import, the stock Debian root)"
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is missing; run scripts/install-system-deps.sh"
    return None


def site_containers_conf(dest: Path) -> Path:
    """containers.conf for this machine: runc, and limits within the hard ones."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)
    dest.write_text('[containers]\n'
                    f'default_ulimits = ["nofile={nofile}:{nofile}", '
                    f'"nproc={nproc}:{nproc}"]\n'
                    '[engine]\nruntime = "runc"\n')
    return dest


def _podman(args: list[str], conf: Path, timeout: float = 600, check: bool = True,
            **kw) -> subprocess.CompletedProcess:
    """``podman ARGS`` with this site's containers.conf; a failure (when ``check``)
    raises with podman's last lines."""
    p = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "CONTAINERS_CONF": str(conf)}, **kw)
    if check and p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-10:])
        raise ContainerImageError(f"podman {' '.join(args[:2])} failed: {tail}")
    return p


def _exists(tag: str, conf: Path) -> bool:
    return _podman(["image", "exists", tag], conf, check=False).returncode == 0


def ensure_runner_image(conf: Path, wheels: list[Path], tag: str = RUNNER_IMAGE) -> str:
    """``tag``, built now if Podman's store lacks it: the stock root plus ``wheels``
    (papermill, ipykernel and what they need, and pip's own wheel) installed offline."""
    if _exists(tag, conf):
        return tag
    if not _exists(BASE_IMAGE, conf):
        root = ensure_image("bookworm")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            _podman(["import", "-", BASE_IMAGE], conf, stdin=tar.stdout)
        finally:
            tar.wait()
    pip = next((w for w in wheels if w.name.startswith("pip-")), None)
    if pip is None:
        raise ContainerImageError("no pip wheel among the wheels to install")
    folder = wheels[0].parent
    if any(w.parent != folder for w in wheels):
        raise ContainerImageError("the wheels must be in one folder")
    name = f"cloudtik-build-{uuid.uuid4().hex[:8]}"
    try:
        _podman(["run", "--name", name, "--network=none", "--volume", f"{folder}:/w:ro",
                 BASE_IMAGE, "python3", f"/w/{pip.name}/pip", "install", "--no-index",
                 "--find-links", "/w", "--break-system-packages", "--no-compile",
                 "--disable-pip-version-check", "papermill", "ipykernel"], conf)
        _podman(["commit", name, tag], conf)
    finally:
        _podman(["rm", "-f", name], conf, check=False)
    return tag
