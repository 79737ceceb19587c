"""The papermill run of a notebook job: what ``python -m papermill IN OUT -f parameters.json
-k KERNEL --cwd DIR --log-output --no-progress-bar`` did, with the kernel on the IPC
transport instead of TCP.

Why: jupyter_client picks a kernel's five TCP ports in the papermill process (bind to port
0, close, write them to the connection file) and the kernel binds them seconds later; any
other process on the host that binds a port in between (another job's papermill or kernel)
can take one, and the kernel dies with ``ZMQError: Address already in use``.  Jobs share
hosts on every backend (local, Slurm nodes, Dask workers).  IPC sockets are files in a
private directory made for this run, so no other process can be handed them.  papermill
has no option for the transport and reads no Jupyter config files; its documented
``execute_notebook(**engine_kwargs)`` hands ``config`` to nbclient's NotebookClient, which
gives it to the KernelManager.

The job's interpreter runs this file's text with ``-c`` (script.py, dask_task.py): on the
system only papermill and a kernel are installed, not jupyter_cloudtik, so it uses the
standard library and papermill only.  Arguments: IN OUT PARAMETERS_FILE KERNEL CWD.  As the
CLI: parameters read as YAML, papermill's log lines on stderr, no progress bar, a failed
cell's PapermillExecutionError raised (exit 1), a dead kernel exits 138.  Where IPC is not
available (Windows, a libzmq without it, no short temporary folder) the kernel uses TCP.
"""

import os
import shutil
import sys
import tempfile
import traceback

# the socket files are DIR/k-1 ... DIR/k-5; a unix socket's path must fit in sun_path
# (108 bytes on Linux, 104 on macOS, with the terminating NUL)
SOCKET_PATH_MAX = 100


def ipc_dir():
    """A new private directory for the kernel's sockets, or None: use TCP."""
    try:
        import zmq

        if os.name == "nt" or not zmq.has("ipc"):
            return None
    except Exception:  # without a usable zmq papermill reports it itself
        return None
    for base in (tempfile.gettempdir(), "/tmp"):
        try:
            d = tempfile.mkdtemp(prefix="ct-", dir=base)  # mode 0700
        except OSError:
            continue
        if len(os.path.join(d, "k-99")) <= SOCKET_PATH_MAX:
            return d
        os.rmdir(d)
    return None


def _remove_on_signals(folder):
    """A cancel (SIGTERM from the backend or the scheduler, SIGHUP) removes the socket
    folder, then ends this process by the same signal, as it ended the CLI."""
    import signal

    def end(signum, _frame):
        shutil.rmtree(folder, ignore_errors=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, end)


def main(argv):
    nb_in, nb_out, parameters_file, kernel, cwd = argv
    # as the CLI: ipykernel's debugger warns about frozen modules otherwise
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import logging

    import nbclient
    import papermill
    from papermill.iorw import read_yaml_file
    from traitlets.config import Config

    logging.basicConfig(level="INFO", format="%(message)s")
    parameters = read_yaml_file(parameters_file) or {}
    sockets = ipc_dir()
    config = Config()
    if sockets:
        config.KernelManager.transport = "ipc"
        config.KernelManager.ip = os.path.join(sockets, "k")
        # the connection file (its key) there too, not a mkstemp file a cancel leaves behind
        config.KernelManager.connection_file = os.path.join(sockets, "kernel.json")
        _remove_on_signals(sockets)
    try:
        papermill.execute_notebook(nb_in, nb_out, parameters=parameters, kernel_name=kernel,
                                   cwd=cwd, log_output=True, progress_bar=False, config=config)
    except nbclient.exceptions.DeadKernelError:
        traceback.print_exc()
        sys.exit(138)
    finally:
        if sockets:
            shutil.rmtree(sockets, ignore_errors=True)


def source():
    """This file's text, for ``python -c``."""
    with open(__file__, encoding="utf-8") as f:
        return f.read()


def argv(python, nb_in, nb_out, parameters_file, kernel, cwd):
    return [python, "-c", source(), nb_in, nb_out, parameters_file, kernel, cwd]


if __name__ == "__main__":
    main(sys.argv[1:])
