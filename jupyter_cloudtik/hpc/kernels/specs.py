"""Kernel specs of the HPC kernel profiles, for the JupyterLab launcher and kernel picker.

``HPCKernelSpecManager`` is jupyter_client's ``KernelSpecManager`` plus one spec per
profile of a backend that can run interactive work (``HPCKernels.profiles``)::

    c.ServerApp.kernel_spec_manager_class = \\
        "jupyter_cloudtik.hpc.kernels.HPCKernelSpecManager"

Nothing is written to disk: the specs follow the config.  Each names the ``cloudtik-hpc``
provisioner with the backend and profile as its config.  ``kernel_specs()`` gives the
same specs as data (the tests read them), and
``write_kernel_specs`` writes them as folders for a server that cannot change its
KernelSpecManager.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel

from ...core.errors import ConfigError
from .profiles import Profile, check_interactive, parse_profile, parse_profiles
from .provisioner import PROVISIONER_NAME, backend_registry, end_orphans_soon, settings_of


def spec_dict(profile: Profile) -> dict[str, Any]:
    """kernel.json of one profile."""
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": profile.title(),
        "language": "python",
        # the interrupt goes through the tunnel as a message (no signal can reach the node)
        "interrupt_mode": "message",
        "metadata": {
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME,
                                   "config": profile.to_config()},
            "cloudtik": {"backend": profile.backend, "profile": profile.name,
                         "cores": profile.cores, "memory": profile.memory,
                         "time": profile.time, "partition": profile.partition,
                         "gpus": profile.gpus},
            "debugger": False,
        },
    }


def kernel_specs(parent: Any = None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """name -> kernel.json for every profile whose backend can run kernels, and one line
    per profile left out (its backend cannot, or is not configured)."""
    hpc, kernels, settings = settings_of(parent)
    registry = backend_registry(hpc, settings)
    configs = registry.configs()
    specs, skipped = {}, []
    profiles, seen = [], set()
    for i, item in enumerate(kernels.profiles or []):
        # one profile's mistake leaves that profile out (said in the log), not every kernel
        try:
            p = parse_profile(item, i)
            if (p.backend, p.name) in seen:
                parse_profiles([item, item])  # raises the same one line as at start-up
        except ConfigError as e:
            skipped.append(f"profiles[{i}] left out: {e.message}")
            continue
        seen.add((p.backend, p.name))
        profiles.append(p)
    for p in profiles:
        cfg = configs.get(p.backend)
        if cfg is None:
            skipped.append(f"profile '{p.name}': backend '{p.backend}' is not configured; "
                           f"configured: {', '.join(sorted(configs))}")
            continue
        try:
            check_interactive(p.backend, str(cfg.get("type")))
        except Exception as e:  # a ConfigError: one line
            skipped.append(f"profile '{p.name}': {e}")
            continue
        specs[p.spec_name] = spec_dict(p)
    return specs, skipped


def _resources() -> str:
    from ipykernel.kernelspec import RESOURCES

    return RESOURCES


class HPCKernelSpecManager(KernelSpecManager):
    """The installed kernel specs, plus one per HPC kernel profile."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the server starts: the jobs of kernels a killed server left running are ended
        try:
            end_orphans_soon(self, self.log)
        except ConfigError:  # the HPC settings themselves: said when specs are listed
            pass

    def _hpc(self) -> dict[str, dict[str, Any]]:
        told = self.__dict__.setdefault("_told", set())
        try:
            specs, skipped = kernel_specs(self)
        except ConfigError as e:  # the HPC settings themselves: no HPC kernel, said once
            if e.message not in told:
                told.add(e.message)
                self.log.error("jupyter_cloudtik: no HPC kernels: %s", e.message)
            return {}
        for line in skipped:  # once per line, not at every listing
            if line not in told:
                told.add(line)
                self.log.warning("jupyter_cloudtik: HPC kernel %s", line)
        return specs

    def find_kernel_specs(self) -> dict[str, str]:
        found = super().find_kernel_specs()
        for name in self._hpc():
            found.setdefault(name, _resources())
        return found

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        hpc = self._hpc()
        if kernel_name in hpc:
            return KernelSpec(resource_dir=_resources(), **hpc[kernel_name])
        return super().get_kernel_spec(kernel_name)

    def get_all_specs(self) -> dict[str, Any]:
        out = super().get_all_specs()
        for name, spec in self._hpc().items():
            out[name] = {"resource_dir": _resources(), "spec": spec}
        return out


def write_kernel_specs(folder: Path, parent: Any = None) -> list[Path]:
    """Write the profiles' specs as kernel folders (``<folder>/<name>/kernel.json``)."""
    specs, _ = kernel_specs(parent)
    out = []
    for name, spec in specs.items():
        d = folder / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "kernel.json").write_text(json.dumps(spec, indent=1))
        out.append(d)
    return out


__all__ = ["HPCKernelSpecManager", "NoSuchKernel", "kernel_specs", "spec_dict",
           "write_kernel_specs"]
