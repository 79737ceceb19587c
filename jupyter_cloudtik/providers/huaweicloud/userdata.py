"""The cloud-init user data that turns a fresh server into a Dask head or worker.

The script is the same for every server of one ``create`` call (N servers, one call): a
server learns who it is (its id, which is also its Dask worker name, and its private IP)
from the instance metadata service.  It checks that it has the client's Python major.minor
and exact dask/distributed/cloudpickle/msgpack versions, installing them on a stock image
from the wheels the client staged in the workspace bucket (runtime/environment.py; one
clear line naming both versions when they cannot match), runs the cluster's setup
commands, and starts the scheduler or the worker in the background, logging to
``$NODE_DIR/node.log`` and the console.

It carries no credentials: nodes reach cloud services as their IAM agency (instance
identity); the script only names the OBS bucket.  The node's TLS certificate and key
(runtime/tls.py) are an object in the workspace's private bucket, fetched at boot with the
agency's temporary credentials from the metadata service (``/openstack/latest/securitykey``)
and kept in ``/run`` (a tmpfs) with mode 0600.  Scheduler and workers then accept mutual
TLS only; the dashboard and the Spark master's UI listen on the head's loopback, and a relay
on the head's port 8788 (``dashboard-relay``) lets in only TLS connections with a
certificate of the cluster's CA, to the UI the client names with ALPN (Dask's by default).
"""

from __future__ import annotations

import base64
import shlex
from typing import Any

from ...core.errors import ConfigError
from ...runtime.dashboard_relay import relay_source
from ...runtime.environment import expected as client_expected
from ...runtime.spark import node_shell_start

SCHEDULER_PORT = 8786
DASHBOARD_PORT = 8787  # the head's loopback only
#: the dashboard from outside: a relay that requires a client certificate of the cluster's CA
DASHBOARD_TLS_PORT = 8788
MAX_USER_DATA = 32 * 1024  # ECS refuses more (base64-encoded)
JAVA_DEB = "openjdk-17-jre-headless"
JAVA_RPM = "java-17-openjdk-headless"
DASK_HTTP_ROUTES = [
    "distributed.http.scheduler.prometheus",
    "distributed.http.scheduler.info",
    "distributed.http.scheduler.json",
    "distributed.http.scheduler.api",
    "distributed.http.health",
    "distributed.http.proxy",
    "distributed.http.statics",
]

TEMPLATE = r"""#!/bin/bash
# jupyter_cloudtik node bootstrap: {role} of cluster {cluster}
set -uo pipefail
NODE_DIR="${{CLOUDTIK_NODE_DIR:-/opt/cloudtik}}"
META="${{CLOUDTIK_METADATA_URL:-http://169.254.169.254}}"
RUN_DIR="${{CLOUDTIK_RUNTIME_DIR:-/run/cloudtik}}"
mkdir -p "$NODE_DIR/work" "$RUN_DIR/tls" && chmod 700 "$RUN_DIR" "$RUN_DIR/tls" && \
  cd "$NODE_DIR" || exit 1
# to the log and to the console (cloud-init copies the console to ECS's console output,
# which is how a failed boot explains itself to `up`)
exec > >(tee -a "$NODE_DIR/node.log") 2>&1
echo "[cloudtik] $(date -u +%FT%TZ) bootstrap of a {role} node"
PY="$(command -v python3 || command -v python)"
[ -n "$PY" ] || {{ echo "[cloudtik] this image has no python3"; exit 1; }}
cat > "$NODE_DIR/cloudtik_node.py" <<'PYEOF'
{tool}
PYEOF
export CLOUDTIK_OBS_BUCKET={bucket} CLOUDTIK_OBS_ENDPOINT={endpoint}
# what the node installs goes to its own folder, first on the path of everything it runs
export CLOUDTIK_SITE="$NODE_DIR/python/site-packages"
export PYTHONPATH="$CLOUDTIK_SITE${{PYTHONPATH:+:$PYTHONPATH}}" PATH="$CLOUDTIK_SITE/bin:$PATH"

# 1. who am I: the instance metadata service
read -r NODE_ID NODE_IP < <("$PY" "$NODE_DIR/cloudtik_node.py" whoami "$META")
[ -n "${{NODE_IP:-}}" ] || {{ echo "[cloudtik] no metadata service at $META"; exit 1; }}
echo "[cloudtik] node $NODE_ID at $NODE_IP"
# the node's own loopback for what only the node may reach (the dashboard, the Spark UI);
# an emulated server sharing its host's loopback gets an address of its own
export NODE_LOOPBACK="${{CLOUDTIK_NODE_LOOPBACK:-127.0.0.1}}"
export CLOUDTIK_NODE_ID="$NODE_ID" CLOUDTIK_CLUSTER={cluster_q} CLOUDTIK_NODE_ROLE={role}

# 2. the runtime: the client's Python and exact package versions (installed from the
#    wheels the client staged in the bucket when the image lacks them), checked
"$PY" "$NODE_DIR/cloudtik_node.py" runtime "$META" {manifest} {expected} || exit 1

# 3. the node's TLS certificate: from the bucket, as the server's agency
"$PY" "$NODE_DIR/cloudtik_node.py" tls "$META" {tls_key} "$RUN_DIR/tls" || exit 1
TLS_ARGS=(--protocol tls --tls-ca-file "$RUN_DIR/tls/ca.pem" --tls-cert "$RUN_DIR/tls/cert.pem"
          --tls-key "$RUN_DIR/tls/key.pem")
{java}# 4. setup commands of the cluster config
{setup}
# 5. start the runtimes in the background (cloud-init must finish)
: > "$NODE_DIR/runtime.pid"
{start}
echo "[cloudtik] runtime started (pid $(tr '\n' ' ' < "$NODE_DIR/runtime.pid"))"
{relay}
"""

#: Spark needs a Java runtime: a stock image without one installs it from the distro's
#: own repositories (the apt / dnf / yum mirror of the image; Debian and Ubuntu name it
#: openjdk-17-jre-headless, the Red Hat family java-17-openjdk-headless)
JAVA_STEP = r"""# 3b. the Spark runtime needs Java: the distro's package when the image has none
if ! command -v java >/dev/null 2>&1; then
  echo "[cloudtik] no java on this image: installing one with the distro's package manager"
  if command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q && \
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
      --no-install-recommends {deb}
  elif command -v dnf >/dev/null 2>&1; then dnf install -y -q {rpm}
  elif command -v yum >/dev/null 2>&1; then yum install -y -q {rpm}
  fi
  command -v java >/dev/null 2>&1 || {{ echo "[cloudtik] the Spark runtime needs a Java 17+ \
runtime and none could be installed: use an image with {deb} (or a Java 17+)"; exit 1; }}
fi
"""

#: the node's helper (stdlib only: the image has nothing else), written at boot; its
#: ``dashboard-relay`` is the shared one of runtime/dashboard_relay.py
NODE_TOOL = r"""
import base64, email.utils, hashlib, hmac, io, json, os, site, sys, time, urllib.parse
import urllib.error, urllib.request, zipfile


def meta_get(base, path):
    return urllib.request.urlopen(base.rstrip("/") + path, timeout=10).read()


class Agency:
    # the server's agency credentials from the metadata service, fetched again before
    # they expire (securitykey's expires_at): OBS refuses expired ones (403
    # InvalidAccessKeyId), and a long task outlives the first ones
    def __init__(self, base):
        self.base, self.cred, self.expires, self.margin = base, None, 0.0, 0.0

    def get(self):
        # a margin of a fifth of the lifetime (at most 5 minutes): never sign with
        # credentials that may expire before OBS sees the request
        if self.cred is None or time.time() > self.expires - self.margin:
            try:
                cred = json.loads(meta_get(self.base, "/openstack/latest/securitykey"))[
                    "credential"]
            except Exception as e:
                sys.exit(f"[cloudtik] no agency credentials from the metadata service ({e})")
            import datetime
            expires = datetime.datetime.strptime(  # e.g. 2026-12-01T13:00:00.000000Z
                cred["expires_at"].rstrip("Z").split(".")[0], "%Y-%m-%dT%H:%M:%S")
            self.cred = cred
            self.expires = expires.replace(tzinfo=datetime.timezone.utc).timestamp()
            self.margin = min(300.0, max(self.expires - time.time(), 0) / 5)
        return self.cred


_AGENCIES = {}


def obs_get(base, key):
    cred = _AGENCIES.setdefault(base, Agency(base)).get()
    bucket, endpoint = os.environ["CLOUDTIK_OBS_BUCKET"], os.environ["CLOUDTIK_OBS_ENDPOINT"]
    date, tok = email.utils.formatdate(usegmt=True), cred["securitytoken"]
    text = f"GET\n\n\n{date}\nx-obs-security-token:{tok}\n/{bucket}/{key}"
    sig = base64.b64encode(hmac.new(cred["secret"].encode(), text.encode(),
                                    hashlib.sha1).digest()).decode()
    u = urllib.parse.urlsplit(endpoint)
    req = urllib.request.Request(f"{u.scheme}://{bucket}.{u.netloc}/{key}", headers={
        "Date": date, "x-obs-security-token": tok,
        "Authorization": f"OBS {cred['access']}:{sig}"})
    proxy = os.environ.get("CLOUDTIK_OBS_PROXY")
    opener = urllib.request.build_opener(
        *([urllib.request.ProxyHandler({"http": proxy, "https": proxy})] if proxy else []))
    try:
        return opener.open(req, timeout=20).read()
    except urllib.error.HTTPError as e:
        body = e.read()[:300].decode("utf-8", "replace")
        sys.exit(f"[cloudtik] OBS refused {key}: HTTP {e.code} {body}")
    except Exception as e:
        sys.exit(f"[cloudtik] OBS {endpoint} did not answer for {key} ({e}): no route to it "
                 "(a private subnet needs a SNAT rule of the NAT gateway) or no name "
                 "resolution")


def versions(names):
    import importlib.metadata as md
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def mismatch(want):
    have = versions(want["packages"])
    return {n: (have[n], v) for n, v in want["packages"].items() if have[n] != v}


def install_wheel(data, target):
    # a wheel is a zip: packages to site-packages, NAME.data/scripts to /usr/local/bin
    z = zipfile.ZipFile(io.BytesIO(data))
    for info in z.infolist():
        parts = info.filename.split("/")
        if info.is_dir():
            continue
        if parts[0].endswith(".data") and len(parts) > 2:
            if parts[1] == "scripts":
                dest = os.path.join(os.path.join(target, "bin") if os.environ.get(
                    "CLOUDTIK_SITE") else "/usr/local/bin", *parts[2:])
            else:  # purelib, platlib
                dest = os.path.join(target, *parts[2:])
        else:
            dest = os.path.join(target, *parts)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(info) as src, open(dest, "wb") as out:
            out.write(src.read())
        if parts[0].endswith(".data") and len(parts) > 2 and parts[1] == "scripts":
            os.chmod(dest, 0o755)


def _version_tuple(text):
    out = []
    for part in text.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits or 0))
    return tuple(out)


def python_allows(spec, here):
    # Requires-Python (PEP 440 clauses, numeric releases), without the packaging library
    v = _version_tuple(here)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op = next(o for o in ("~=", "==", "!=", "<=", ">=", "<", ">", "") if clause.startswith(o))
        text = clause[len(op):].strip()
        if text.endswith(".*"):
            want = _version_tuple(text[:-2])
            same = v[:len(want)] == want
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        w = _version_tuple(text)
        n = max(len(v), len(w))
        a, b = v + (0,) * (n - len(v)), w + (0,) * (n - len(w))
        ok = {"==": a == b, "": a == b, "!=": a != b, "<=": a <= b, ">=": a >= b, "<": a < b,
              ">": a > b, "~=": a >= b and a[:len(w) - 1] == w[:len(w) - 1]}[op]
        if not ok:
            return False
    return True


def wheel_problem(filename, data):
    # why this wheel cannot be installed here (tags, Requires-Python), or None
    import platform
    parts = filename[:-4].split("-")
    name, version, pytags, abis, plats = parts[0], parts[1], parts[-3], parts[-2], parts[-1]
    here = platform.python_version()
    major, minor = sys.version_info[:2]
    what = f"package {name} {version} does not install on this node"
    def py_ok(t):  # as pip's compatible tags: py3, py3X for X up to ours, our cp3X
        if t in ("py3", f"cp{major}{minor}"):
            return True
        if t.startswith("py3") and t[3:].isdigit():
            return int(t[3:]) <= minor
        if t.startswith("cp3") and "abi3" in abis.split("."):
            return int(t[3:] or 0) <= minor
        return False
    if not any(py_ok(t) for t in pytags.split(".")):
        return f"{what}: its wheel {filename} is for {pytags}, this node has Python {here}"
    if not any(a in ("none", "abi3", f"cp{major}{minor}") for a in abis.split(".")):
        return f"{what}: its wheel {filename} is for the ABI {abis}, this node has Python {here}"
    machine = platform.machine()
    if not any(p == "any" or (p.startswith(("linux", "manylinux", "musllinux"))
                              and p.endswith(machine)) for p in plats.split(".")):
        return (f"{what}: its wheel {filename} is for {plats}, this node is "
                f"{sys.platform} {machine}")
    z = zipfile.ZipFile(io.BytesIO(data))
    meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
    for line in (z.read(meta).decode("utf-8", "replace").splitlines() if meta else []):
        if not line.strip():
            break
        if line.lower().startswith("requires-python:"):
            spec = line.split(":", 1)[1].strip()
            if not python_allows(spec, here):
                return f"{what}: it requires Python {spec}, this node has Python {here}"
    return None


def install_with_pip(files, target):
    # the image has pip: it installs the staged files and nothing else (no index, none of
    # the image's pip configuration)
    import subprocess
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                        "--disable-pip-version-check", "--no-warn-script-location",
                        "--quiet", "--upgrade", "--target", target, *files],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()][-6:]
        sys.exit("[cloudtik] pip could not install the staged packages: " + " | ".join(tail))


def runtime(base, manifest_key, expected):
    want = json.loads(expected)
    py = "%d.%d" % sys.version_info[:2]
    if py != want["python"]:
        sys.exit(f"[cloudtik] version mismatch: this node has Python {py}, the client has "
                 f"Python {want['python']}; use an image with Python {want['python']}")
    target = os.environ.get("CLOUDTIK_SITE") or site.getsitepackages()[0]
    if os.path.isdir(target) and target not in sys.path:
        sys.path.insert(0, target)
    manifest = None
    if want.get("extra"):  # the packages the cluster asked for are named in the manifest
        manifest = json.loads(obs_get(base, manifest_key))
        want["packages"].update(manifest.get("packages") or {})
    bad = mismatch(want)
    if bad:
        t0 = time.monotonic()
        manifest = manifest or json.loads(obs_get(base, manifest_key))
        os.makedirs(target, exist_ok=True)
        if target not in sys.path:
            sys.path.insert(0, target)
        import importlib.util
        use_pip = importlib.util.find_spec("pip") is not None
        spool = os.path.join(os.environ.get("TMPDIR") or "/tmp", "cloudtik-wheels")
        os.makedirs(spool, exist_ok=True)
        files = []
        todo = []
        for w in manifest["wheels"]:  # only what this node lacks at the right version
            name, version = w["key"].rsplit("/", 1)[-1].split("-")[:2]
            if versions([name])[name] != version:
                todo.append(w)
        for w in todo:
            data = obs_get(base, w["key"])
            if hashlib.sha256(data).hexdigest() != w["sha256"]:
                sys.exit(f"[cloudtik] wheel {w['key']} does not match its checksum")
            filename = w["key"].rsplit("/", 1)[-1]
            problem = wheel_problem(filename, data)
            if problem:
                sys.exit("[cloudtik] " + problem)
            if use_pip:
                path = os.path.join(spool, filename)
                with open(path, "wb") as f:
                    f.write(data)
                files.append(path)
            else:
                install_wheel(data, target)
        if use_pip and files:
            install_with_pip(files, target)
        import importlib
        importlib.invalidate_caches()
        print(f"[cloudtik] runtime: {len(todo)} wheels from OBS installed "
              f"{'with pip ' if use_pip else ''}in {time.monotonic() - t0:.1f}s", flush=True)
        bad = mismatch(want)
    if bad:
        sys.exit("[cloudtik] version mismatch: " + "; ".join(
            f"this node has {n} {h or '(none)'}, the client has {n} {v}"
            for n, (h, v) in sorted(bad.items())))
    print("[cloudtik] runtime matches the client: Python " + py + ", " + ", ".join(
        f"{n} {v}" for n, v in sorted(want["packages"].items())), flush=True)


def tls(base, key, out):
    bundle = json.loads(obs_get(base, key))
    for name in ("ca", "cert", "key"):
        fd = os.open(os.path.join(out, name + ".pem"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600)
        with os.fdopen(fd, "w") as f:
            f.write(bundle[name])
    print("[cloudtik] TLS certificate in place", flush=True)


def whoami(base):
    for attempt in range(5):  # as cloud-init does: the service may not answer at once
        try:
            uuid = json.loads(meta_get(base, "/openstack/latest/meta_data.json"))["uuid"]
            print(uuid, meta_get(base, "/latest/meta-data/local-ipv4").decode())
            return
        except Exception as e:
            error = e
            time.sleep(1 + attempt)
    print(f"[cloudtik] metadata service: {error}", file=sys.stderr)


""" + relay_source() + r"""

if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"whoami": whoami, "runtime": runtime, "tls": tls,
     "dashboard-relay": dashboard_relay}[cmd](*args)
""".strip()


#: the workspace's wheels, shared by its clusters: ``WHEELS_PREFIX/<sha256>/<file>.whl``
#: (content-addressed, so a file is staged once per workspace and never changes)
WHEELS_PREFIX = "cloudtik/wheels/"


def wheel_key(sha256: str, filename: str) -> str:
    return f"{WHEELS_PREFIX}{sha256}/{filename}"


#: "Listing Objects in a Bucket" (OBS API, obs_04_0022): max-keys 1..1000
OBS_LIST_PAGE = 1000


def list_keys(clients: Any, bucket: str, prefix: str | None, *, what: str | None = None,
              missing_ok: bool = True) -> list[str]:
    """Every object key under ``prefix`` (None: the whole bucket), page by page.

    ListObjects gives at most 1,000 keys an answer; ``NextMarker`` continues a truncated
    one.  ``is_truncated`` is not trusted: the SDK turns the XML text "false" into True
    (``bool("false")`` in huaweicloudsdkcore's ``_deserialize_primitive``), so NextMarker,
    or a full page (then its last key is the marker), says there is more."""
    from huaweicloudsdkobs.v1 import ListObjectsRequest

    keys: list[str] = []
    marker = None
    while True:
        resp = clients.call("obs", "list_objects", ListObjectsRequest(
            bucket_name=bucket, prefix=prefix, marker=marker, max_keys=OBS_LIST_PAGE),
            missing_ok=missing_ok, what=what or f"list {prefix} in the workspace bucket")
        page = [o.key for o in (getattr(resp, "contents", None) or [])]
        keys += page
        marker = getattr(resp, "next_marker", None) or (
            page[-1] if len(page) >= OBS_LIST_PAGE else None)
        if not page or not marker:
            return keys


def delete_keys(clients: Any, bucket: str, keys: list[str]) -> None:
    from huaweicloudsdkobs.v1 import DeleteObjectRequest

    for key in keys:
        clients.call("obs", "delete_object", DeleteObjectRequest(
            bucket_name=bucket, object_key=key), missing_ok=True,
            what="delete the workspace's staged wheels")


def manifest_key(cluster: str) -> str:
    """Where the cluster's runtime manifest (wheels and their checksums) lives."""
    return f"cloudtik/clusters/{cluster}/runtime.json"


def tls_object_key(cluster: str) -> str:
    """Where in the workspace bucket the node TLS bundle of ``cluster`` lives."""
    return f"cloudtik/clusters/{cluster}/node-tls.json"


def _start_command(role: str, runtime: dict[str, Any]) -> str:
    dask_opts = runtime.get("dask") or {}
    if role == "head":
        # the dashboard has no authentication of its own: the head's loopback only, and
        # from outside only through the mutual-TLS relay in front of it (relay_command)
        args = ["-m", "distributed.cli.dask_scheduler", "--host", "$NODE_IP", "--port",
                str(SCHEDULER_PORT), "--dashboard-address", f'"$NODE_LOOPBACK:{DASHBOARD_PORT}"',
                '"${TLS_ARGS[@]}"',
                *[shlex.quote(o) for o in dask_opts.get("scheduler_options", [])]]
    else:
        args = ["-m", "distributed.cli.dask_worker", shlex.quote(runtime["scheduler_address"]),
                "--name", "$NODE_ID", "--host", "$NODE_IP",
                "--nthreads", str(max(int(runtime.get("nthreads") or 1), 1)),
                "--memory-limit", str(int(runtime.get("memory_limit") or 0)),
                "--local-directory", '"$NODE_DIR/work"',
                "--dashboard-address", '"$NODE_LOOPBACK:0"',
                "--death-timeout", "120", '"${TLS_ARGS[@]}"',
                *(["--nanny"] if dask_opts.get("nanny") else ["--no-nanny"]),
                *[shlex.quote(o) for o in dask_opts.get("worker_options", [])]]
    return "\n".join([
        f"export DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES={shlex.quote(repr(DASK_HTTP_ROUTES))}",
        'echo "[cloudtik] $(date -u +%FT%T.%3NZ) starting dask"',
        f'nohup "$PY" {" ".join(args)} >>"$NODE_DIR/node.log" 2>&1 &',
        'echo $! >> "$NODE_DIR/runtime.pid"',
        'echo $! > "$NODE_DIR/dask.pid"'])  # the dashboard relay watches it


def start_commands(role: str, runtime: dict[str, Any]) -> str:
    """Every runtime of the node (``runtime.types``: Dask by default, Spark, or both)."""
    parts = []
    for t in runtime.get("types") or ["dask"]:
        if t == "dask":
            parts.append(_start_command(role, runtime))
        elif t == "spark":
            parts.append(node_shell_start(role, runtime))
        else:
            raise ConfigError(f"runtime.types: the huaweicloud provider runs dask and spark, "
                              f"not {t!r}", field="runtime.types", value=t)
    return "\n".join(parts)


#: the ALPN route name of each web UI the head's relay serves (the Spark UI proxy of
#: api/spark_ui.py offers ``cloudtik-spark``; the dashboard proxy offers none: the first)
RELAY_ROUTES = {"dask": DASHBOARD_PORT, "spark": 8080}  # runtime/spark.py NODE_UI_PORT


def relay_command(types: list[str]) -> str:
    """The head's mutual-TLS relay (TEMPLATE's {relay}), started after the runtimes, in
    front of the web UI of each (Dask's dashboard first: the route of a client that asks
    for none), watching their pids."""
    names = [t for t in ("dask", "spark") if t in types]
    if not names:
        return ""
    routes = ",".join(f"{t}:{RELAY_ROUTES[t]}" for t in names)
    pids = " ".join(f'"$(cat "$NODE_DIR/{t}.pid")"' for t in reversed(names))
    return ('nohup "$PY" "$NODE_DIR/cloudtik_node.py" dashboard-relay "$NODE_IP" '
            f'{DASHBOARD_TLS_PORT} {routes} "$RUN_DIR/tls" {pids} '
            '>>"$NODE_DIR/node.log" 2>&1 &')


def render(role: str, runtime: dict[str, Any], *, storage: dict[str, Any] | None = None,
           expected: dict[str, Any] | None = None) -> str:
    """The user data script of a node of ``role`` (head or worker)."""
    import json

    if expected is None:
        expected = client_expected()
    spark = "spark" in (runtime.get("types") or ())
    if spark:  # the driver and the executors must run the same Spark: checked at boot
        want = (runtime.get("spark") or {}).get("version")
        if want:
            expected = {**expected, "packages": {**expected["packages"], "pyspark": want}}
    if runtime.get("pip") or runtime.get("sync_env"):
        # their versions are in the manifest (sync_env names hundreds: too many for here)
        expected = {**expected, "extra": True}
    setup = "\n".join(
        f'echo "[cloudtik] setup: {i + 1}"\n( {cmd} ) || {{ echo "[cloudtik] setup command '
        f'{i + 1} failed"; exit 1; }}'
        for i, cmd in enumerate(runtime.get("setup_commands") or [])) or ":"
    if not storage or not storage.get("bucket"):
        raise ConfigError("provider.workspace_name: the workspace has no OBS bucket, which "
                          "delivers the nodes' TLS certificates and runtime; create the "
                          "workspace with managed_storage: true",
                          field="provider.workspace_name")
    cluster = runtime.get("cluster_name", "")
    return TEMPLATE.format(
        role=role, cluster=cluster, cluster_q=shlex.quote(cluster), tool=NODE_TOOL,
        bucket=shlex.quote(storage["bucket"]),
        endpoint=shlex.quote(storage.get("endpoint") or ""),
        manifest=shlex.quote(manifest_key(cluster)),
        expected=shlex.quote(json.dumps(expected, sort_keys=True)),
        tls_key=shlex.quote(tls_object_key(cluster)), setup=setup,
        java=JAVA_STEP.format(deb=JAVA_DEB, rpm=JAVA_RPM) if spark else "",
        start=start_commands(role, runtime),
        relay=relay_command(list(runtime.get("types") or ["dask"])) if role == "head"
        else "")


def encode(script: str) -> str:
    data = base64.b64encode(script.encode()).decode()
    if len(data) > MAX_USER_DATA:
        raise ConfigError(
            f"setup_commands: the node start-up script is {len(data)} bytes base64-encoded; "
            f"ECS accepts at most {MAX_USER_DATA}; shorten setup_commands (e.g. put them in a "
            "script in the workspace bucket)", field="setup_commands")
    return data
