"""`make demo`: run examples/quickstart.ipynb headless and check what it computed.

Runs in a private state folder, prints the checked result and the time to ready, and fails
if any process of the demo is still alive afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    state = Path(tempfile.mkdtemp(prefix="cloudtik-demo-"))
    os.environ["CLOUDTIK_STATE_DIR"] = str(state)
    os.environ["CLOUDTIK_LAUNCHER_IDLE"] = "0"  # nothing lingers after the demo
    os.environ.setdefault("CLOUDTIK_PROGRESS", "text")

    import nbformat
    from nbclient import NotebookClient

    from cloudtik_emulators.processes import cloudtik_processes, describe, kill_all

    nb = nbformat.read(HERE / "quickstart.ipynb", as_version=4)
    print(f"running {HERE / 'quickstart.ipynb'} (state folder {state})", flush=True)
    started = time.perf_counter()
    # the kernel over Unix sockets in the state folder: nothing listens on a TCP port
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(state / "kernel"))
    client = NotebookClient(nb, km=km, timeout=300, resources={
        "metadata": {"path": str(HERE)}})
    try:
        client.execute()
    finally:
        if km.has_kernel:  # a kernel manager given to nbclient is the caller's to stop
            km.shutdown_kernel()
        # the executed notebook goes with the demo's state, not into the source tree
        nbformat.write(nb, state / "quickstart.out.ipynb")
    took = time.perf_counter() - started

    lines = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                lines.extend(out["text"].splitlines())
    result = [line for line in lines if line.startswith("RESULT")]
    ready = [line for line in lines if line.startswith("cluster ready in")]
    for line in lines:
        if line.startswith(("RESULT", "cluster ready", "computed on", "cluster 'quickstart'")):
            print(f"  {line}")
    if not result or not ready:
        print("demo FAILED: the notebook did not print its checked result", file=sys.stderr)
        return 1

    deadline = time.monotonic() + 15
    left = cloudtik_processes(state)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = cloudtik_processes(state)
    if left:
        print("demo FAILED: processes left behind:\n" + describe(left), file=sys.stderr)
        kill_all(left)
        return 1
    print(f"demo OK in {took:.1f}s: result checked, no process left behind "
          f"(executed notebook: {state / 'quickstart.out.ipynb'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
