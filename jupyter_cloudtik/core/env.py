"""Every environment variable jupyter_cloudtik reads or sets, named once.

Modules import the name from here (``env.API_URL``) instead of spelling the string, so a
rename is one edit and ``grep`` finds every reader.  Grouped by who sets them.
"""

from __future__ import annotations

#: every variable of ours starts with it (jobs of a local backend never inherit them)
PREFIX = "CLOUDTIK_"

# where state lives (users, tests, the server, nodes)
STATE_DIR = "CLOUDTIK_STATE_DIR"
WORKDIR = "CLOUDTIK_WORKDIR"
PROGRESS = "CLOUDTIK_PROGRESS"
LAUNCHER_IDLE = "CLOUDTIK_LAUNCHER_IDLE"
#: seconds a local head waits before adding its Bokeh dashboard (providers/local/dashboard_later.py)
DASHBOARD_DELAY = "CLOUDTIK_DASHBOARD_DELAY"

# set by the Jupyter server extension in the kernels it starts
API_URL = "CLOUDTIK_API_URL"
API_TOKEN = "CLOUDTIK_API_TOKEN"
API_CA_BUNDLE = "CLOUDTIK_API_CA_BUNDLE"
HUB_SERVICE_URL = "CLOUDTIK_HUB_SERVICE_URL"
# ...and in its own environment, so its terminals see it: the state folder whose dashboards
# and Spark UIs it serves, and their paths ({"state_dir", "dashboard", "spark"}, JSON)
SERVER_LINKS = "CLOUDTIK_SERVER_LINKS"
# set by jupyter_server_terminals in its terminals (the server's own URL, base URL included)
JUPYTER_SERVER_URL = "JUPYTER_SERVER_URL"

# secrets
SECRET_KEY = "CLOUDTIK_SECRET_KEY"
SECRET_BACKEND = "CLOUDTIK_SECRET_BACKEND"
VAULT_PREFIX = "CLOUDTIK_VAULT_PREFIX"
VAULT_MOUNT = "CLOUDTIK_VAULT_MOUNT"

# nodes of the local provider
NODE_ID = "CLOUDTIK_NODE_ID"
NODE_DIR = "CLOUDTIK_NODE_DIR"
CLUSTER = "CLOUDTIK_CLUSTER"

# a Huawei Cloud node's bootstrap (providers/huaweicloud/userdata.py writes them into the
# node's user data, whose shell and Python read them there, before the package is installed)
RUNTIME_DIR = "CLOUDTIK_RUNTIME_DIR"
NODE_LOOPBACK = "CLOUDTIK_NODE_LOOPBACK"
OBS_PROXY = "CLOUDTIK_OBS_PROXY"

# storage and hpc
RCLONE = "CLOUDTIK_RCLONE"
STORAGES = "CLOUDTIK_STORAGES"
HPC_CONFIG = "CLOUDTIK_HPC_CONFIG"
#: on an HPC kernel's node: the file with the server's URL and the kernel's own token
NODE_API = "CLOUDTIK_NODE_API"

# zones
ZONE_NAME = "CLOUDTIK_ZONE_NAME"
ZONE_KEY = "CLOUDTIK_ZONE_KEY"
ZONE_TOKEN = "CLOUDTIK_ZONE_TOKEN"

# the hub's sidekicks and job gateway
SIDEKICK_NAME = "CLOUDTIK_SIDEKICK_NAME"
SIDEKICK_USER = "CLOUDTIK_SIDEKICK_USER"
SIDEKICK_TOKEN = "CLOUDTIK_SIDEKICK_TOKEN"
SIDEKICK_PREFIX = "CLOUDTIK_SIDEKICK_PREFIX"
SIDEKICK_PORT = "CLOUDTIK_SIDEKICK_PORT"
JOB_GATEWAY_BACKEND = "CLOUDTIK_JOB_GATEWAY_BACKEND"
JOB_GATEWAY_ROOT = "CLOUDTIK_JOB_GATEWAY_ROOT"
ALLOW_LOCAL_EXECUTION = "CLOUDTIK_ALLOW_LOCAL_EXECUTION"
# names of a side-kick's variables that hold secrets (jobs it starts never inherit them)
SIDEKICK_SECRET_ENV = "CLOUDTIK_SIDEKICK_SECRET_ENV"
#: the Python of the egress proxy's own environment (mitmproxy's pins; hub/egress)
EGRESS_PYTHON = "CLOUDTIK_EGRESS_PYTHON"

# emulators (emulators/cloudtik_emulators/)
EMULATOR_ID = "CLOUDTIK_EMULATOR_ID"
EMULATED_SERVER = "CLOUDTIK_EMULATED_SERVER"
METADATA_URL = "CLOUDTIK_METADATA_URL"
#: caches of the emulators' root file systems (an ARC 7 chroot, a Huawei Cloud image)
ARC_CACHE = "CLOUDTIK_ARC_CACHE"
ARC7_CHROOT = "CLOUDTIK_ARC7_CHROOT"
IMAGE_CACHE = "CLOUDTIK_IMAGE_CACHE"
#: ``1``: jsonschema keeps its slow "iri" format checker (core/lazy_jsonschema.py)
IRI_FORMAT = "CLOUDTIK_IRI_FORMAT"


# Variables that must not travel from the process that started the launcher (a kernel, a
# server) into node processes: API tokens and cloud credentials.
_SENSITIVE_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "_SK", "API_KEY")
_SENSITIVE_PREFIXES = ("HUAWEICLOUD_SDK_", "AWS_SECRET", "JUPYTERHUB_", "JPY_")


def scrub_environment(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` without credentials and session tokens."""
    clean = {}
    for key, value in env.items():
        upper = key.upper()
        if upper.startswith(_SENSITIVE_PREFIXES) or any(m in upper for m in _SENSITIVE_MARKERS):
            continue
        clean[key] = value
    return clean
