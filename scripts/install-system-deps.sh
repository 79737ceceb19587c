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
  # HPC: Slurm accounting (sacct answers for finished jobs; FirecREST needs it)
  [slurmdbd]=/usr/sbin/slurmdbd
  [mariadb-server]=/usr/sbin/mariadbd
  # HPC: the slurm backend over SSH is tested against a real sshd on loopback
  [openssh-server]=/usr/sbin/sshd
  # HPC: a real ARC CE (A-REX 6.17, REST 1.0) for the arc backend's tests
  [nordugrid-arc-arex]=/usr/share/arc/arc-arex-start
  [nordugrid-arc-client]=/usr/bin/arcsub
  [nordugrid-arc-plugins-needed]=/usr/share/doc/nordugrid-arc-plugins-needed
  [nordugrid-arc-plugins-arcrest]=/usr/share/doc/nordugrid-arc-plugins-arcrest
  [nordugrid-arc-plugins-internal]=/usr/share/doc/nordugrid-arc-plugins-internal
  [nordugrid-arc-arcctl]=/usr/sbin/arcctl
  [nordugrid-arc-arcctl-service]=/usr/share/doc/nordugrid-arc-arcctl-service
  [nordugrid-arc-hed]=/usr/sbin/arched
  [python3-nordugrid-arc]=/usr/share/doc/python3-nordugrid-arc
  # ARC 7 (REST 1.1, tokens) runs from Debian 13's packages in a chroot the tests build
  [debootstrap]=/usr/sbin/debootstrap
  # HPC: the container path of a job's environment, run for real with Podman (an image
  # built from the stock Debian root; runc: crun refuses this machine's hybrid cgroups)
  [podman]=/usr/bin/podman
  [runc]=/usr/sbin/runc
  [fuse3]=/usr/bin/fusermount3   # `rclone mount` (storage mounts) unmounts with fusermount3
  [chromium]=/usr/bin/chromium          # browser tests of the side panel (Playwright)
  # the hub sidekick runs what users control (side-kicks, local clusters and jobs) in a
  # bubblewrap sandbox that cannot see its state folder (docs/security.md#the-sandbox)
  [bubblewrap]=/usr/bin/bwrap
  # the egress proxy's path rules are tested against the servers whose readings of a path
  # differ: nginx, Apache httpd and Tomcat (run as private instances on loopback)
  [nginx-light]=/usr/sbin/nginx
  [apache2]=/usr/sbin/apache2
  [tomcat10-user]=/usr/bin/tomcat10-instance-create
  [curl]=/usr/bin/curl                  # the docs' curl examples are run as written
  [nodejs]=/usr/bin/node                # building the side panel (not needed at run time)
  [npm]=/usr/bin/npm                    # configurable-http-proxy for the JupyterHub tests
  # realistic emulated servers (tests -m realistic): network namespaces, veth pairs and
  # bridges, NAT rules, and a stock Debian root (docs/huaweicloud.md#realistic-mode)
  [iproute2]=/usr/sbin/ip
  [iptables]=/usr/sbin/iptables
  # the Spark runtime: pyspark's JVMs (master, workers, the driver) need Java 17+
  [openjdk-17-jre-headless]=/usr/lib/jvm/java-17-openjdk-amd64/bin/java
)

# `install-system-deps.sh demo` (make demo): only what the demo runs, a Python venv;
# `... lab` (make lab): that and Node.js to build the side panel
case "${1:-all}" in
  demo) keep=" python3-venv " ;;
  lab) keep=" python3-venv nodejs " ;;
  all) keep="" ;;
  *) echo "usage: $0 [all|demo|lab]" >&2; exit 2 ;;
esac
if [ -n "$keep" ]; then
  for pkg in "${!PACKAGES[@]}"; do
    [[ "$keep" == *" $pkg "* ]] || unset "PACKAGES[$pkg]"
  done
fi

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
# any Java 17+ on PATH (or JAVA_HOME) will do for Spark
if command -v java >/dev/null || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]; then
  missing=("${missing[@]/openjdk-17-jre-headless}")
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
