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
import os
import sys
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel

from ...core.errors import CloudTikError, ConfigError, ConflictError
from .profiles import (
    Profile,
    check_interactive,
    parse_profile,
    parse_profiles,
    split_spec_name,
)
from .provisioner import (
    PROVISIONER_NAME,
    backend_registry,
    end_orphans_soon,
    said_to_server,
    settings_of,
)
from .through_hub import hub_profiles, hub_url


def spec_dict(profile: Profile) -> dict[str, Any]:
    """kernel.json of one profile (at a custom size, when it has one)."""
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
                         "gpus": profile.gpus,
                         # the launcher's "custom size" form offers the profiles that have
                         # bounds, and shows them
                         "custom": (profile.custom.to_dict()
                                    if profile.custom and not profile.size else None),
                         "custom_size": profile.size is not None,
                         # the hub's sidekick submits it (the size form asks it)
                         "hub": profile.hub},
            "debugger": False,
        },
    }


def usable_profiles(parent: Any = None) -> tuple[list[Profile], list[str]]:
    """The profiles whose backend is configured and can run kernels, and one line per
    profile left out (a mistake in it, its backend cannot, or is not configured)."""
    hpc, kernels, settings = settings_of(parent)
    registry = backend_registry(hpc, settings)
    configs = registry.configs()
    skipped = []
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
        profiles.append(p)
    url = hub_url(getattr(parent, "config", None))
    if url is not None:
        try:
            profiles += hub_profiles(url)
        except CloudTikError as e:  # none offered, and said: never read as "none granted"
            skipped.append(f"profiles of the hub's sidekick are not listed: {e}")
    return profiles, skipped


def kernel_specs(parent: Any = None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """name -> kernel.json for every profile whose backend can run kernels, and one line
    per profile left out."""
    profiles, skipped = usable_profiles(parent)
    return {p.spec_name: spec_dict(p) for p in profiles}, skipped


def custom_spec(parent: Any, name: str) -> dict[str, Any] | None:
    """kernel.json of a custom-size spec name (``<profile's spec>--c4-t90m``); None when
    the name is not one.  Beyond the profile's bounds: the ``ConfigError``."""
    base, size = split_spec_name(name)
    if size is None:
        return None
    profiles, _ = usable_profiles(parent)
    for p in profiles:
        if p.spec_name == base:
            return spec_dict(p.with_size(size))
    return None


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

    def _custom(self, name: str) -> dict[str, Any] | None:
        """A custom size's spec, remembered so the kernel picker lists it while this
        server runs (a spec beyond its profile's bounds: the one-line refusal)."""
        try:
            spec = custom_spec(self, name)
        except ConfigError as e:
            raise said_to_server(e, 400) from None
        if spec is not None:
            self.remember_custom(name)
        return spec

    def remember_custom(self, name: str) -> None:
        """List this custom size's spec from now on (the launcher's form chose it), in
        this server and the next ones on the same state folder: JupyterLab finds a
        notebook's kernel only among the listed specs (else it asks for another)."""
        self.__dict__.setdefault("_custom_names", set()).add(name)
        try:
            chosen_sizes(self, add=name)
        except (OSError, ConfigError) as e:  # listed by this server still; said why not more
            self.log.warning("jupyter_cloudtik: the custom kernel size %s is not kept for "
                             "the next server: %s", name, e)

    def _used_custom(self) -> dict[str, dict[str, Any]]:
        """The custom sizes chosen here and on this state folder that still fit their
        profile's bounds (an admin who narrowed them has them no longer offered)."""
        try:
            kept = chosen_sizes(self)
        except (OSError, ConfigError):
            kept = []
        names = set(self.__dict__.get("_custom_names", ())) | set(kept)
        if not names:
            return {}
        try:
            profiles = {p.spec_name: p for p in usable_profiles(self)[0]}
        except ConfigError:
            return {}
        out = {}
        for name in sorted(names):
            base, size = split_spec_name(name)
            p = profiles.get(base)
            if p is None or size is None:
                continue
            try:
                out[name] = spec_dict(p.with_size(size))
            except ConfigError:
                continue
        return out

    def find_kernel_specs(self) -> dict[str, str]:
        found = super().find_kernel_specs()
        for name in {**self._hpc(), **self._used_custom()}:
            found.setdefault(name, _resources())
        return found

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        hpc = self._hpc()
        if kernel_name in hpc:
            return KernelSpec(resource_dir=_resources(), **hpc[kernel_name])
        if kernel_name.startswith(("cloudtik-hpc-", "cloudtik-hub-")):
            spec = self._custom(kernel_name)
            if spec is not None:
                return KernelSpec(resource_dir=_resources(), **spec)
        return super().get_kernel_spec(kernel_name)

    def get_all_specs(self) -> dict[str, Any]:
        out = super().get_all_specs()
        for name, spec in {**self._hpc(), **self._used_custom()}.items():
            out[name] = {"resource_dir": _resources(), "spec": spec}
        return out


SIZES_FILE = "hpc-kernel-sizes.json"
MAX_KEPT_SIZES = 100  # the most recently chosen; older ones are no longer listed


def chosen_sizes(parent: Any, add: str | None = None) -> list[str]:
    """The custom sizes' spec names chosen on this state folder, newest last (``add``:
    one more).  Names only: each is checked again against the bounds when listed and at
    every start, so a name written here by hand gets no more than the form."""
    _hpc, _kernels, settings = settings_of(parent)
    path = Path(settings.state_dir) / SIZES_FILE
    try:
        names = json.loads(path.read_text())
    except FileNotFoundError:
        names = []
    except ValueError:  # a broken file: start again rather than list nothing ever
        names = []
    if not isinstance(names, list):
        names = []
    names = [n for n in names if isinstance(n, str) and split_spec_name(n)[1] is not None]
    if add is not None and (not names or names[-1] != add):
        names = [n for n in names if n != add] + [add]
        names = names[-MAX_KEPT_SIZES:]
        tmp = path.with_name(f".{SIZES_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(names))
        os.replace(tmp, path)
    return names


def remember_custom(serverapp: Any, name: str) -> None:
    """The server's spec manager lists ``name`` from now on; a server whose spec manager is
    not ours cannot start HPC kernels at all, which is said in one line."""
    ksm = getattr(serverapp, "kernel_spec_manager", None)
    if not isinstance(ksm, HPCKernelSpecManager):
        raise ConflictError(
            "kernel_spec_manager_class: this server does not offer HPC kernels; set "
            "c.ServerApp.kernel_spec_manager_class = "
            "'jupyter_cloudtik.hpc.kernels.HPCKernelSpecManager'",
            field="kernel_spec_manager_class")
    ksm.remember_custom(name)


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


__all__ = ["HPCKernelSpecManager", "NoSuchKernel", "custom_spec", "kernel_specs",
           "remember_custom", "spec_dict", "usable_profiles", "write_kernel_specs"]
