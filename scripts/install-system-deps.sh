#!/usr/bin/env bash
# Install the Debian packages jupyter_cloudtik's demo and tests use, if any is missing.
# Safe to run again: it does nothing when everything is there.
set -euo pipefail

# package -> a file that proves it is installed
declare -A PACKAGES=(
  [python3-venv]=/usr/lib/python3/dist-packages
  # HPC: a real single-node Slurm for the slurm backend's tests and benchmark
  [slurm-wlm]=/usr/sbin/slurmctld
  [munge]=/usr/sbin/munged
  # HPC: the slurm backend over SSH is tested against a real sshd on loopback
  [openssh-server]=/usr/sbin/sshd
  [fuse3]=/usr/bin/fusermount3   # `rclone mount` (storage mounts) unmounts with fusermount3
  [chromium]=/usr/bin/chromium          # browser tests of the side panel (Playwright)
  [nodejs]=/usr/bin/node                # building the side panel (not needed at run time)
  [npm]=/usr/bin/npm                    # configurable-http-proxy for the JupyterHub tests
)

missing=()
for pkg in "${!PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# python3-venv is only needed when the interpreter has no venv module of its own
if python3 -c "import venv, ensurepip" 2>/dev/null; then
  missing=("${missing[@]/python3-venv}")
fi
# any node >= 18 on PATH will do (e.g. from nodesource)
if command -v node >/dev/null; then
  missing=("${missing[@]/nodejs}")
fi
# any npm on PATH will do (nodesource's nodejs ships one)
if command -v npm >/dev/null; then
  missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
