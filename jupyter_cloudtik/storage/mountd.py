"""The mount supervisor daemon's entry point (``python -m jupyter_cloudtik.storage.mountd``,
started by ``mounts.ensure_supervisor``): one process per state folder that owns every
``rclone mount`` (see ``mounts``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
from pathlib import Path

from ..core.settings import CloudTik, load_user_config
from .manager import StorageManager
from .mounts import DAEMON_MODULE, PROC_TITLE, MountSupervisor, _try_lock, log


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m " + DAEMON_MODULE)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--settings", default="{}", help="c.Storage values as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fd = _try_lock(args.state_dir)
    if fd is None:
        log.info("another mount supervisor serves %s", args.state_dir)
        return
    pid_file = Path(args.state_dir) / "storage" / "mountd.pid"
    pid_file.write_text(str(os.getpid()))
    try:
        import setproctitle

        setproctitle.setproctitle(f"{PROC_TITLE} {args.state_dir}")
    except Exception:
        pass
    config = load_user_config()
    for key, value in json.loads(args.settings).items():
        config.Storage[key] = value
    settings = CloudTik(config=config, state_dir=args.state_dir)
    manager = StorageManager(settings=settings, user="mount-supervisor", supervise=False)
    logging.getLogger().handlers[0].addFilter(manager.log_filter())
    supervisor = MountSupervisor(manager)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stopping.set())
    log.info("mount supervisor %d watching %s", os.getpid(), args.state_dir)
    try:
        supervisor.run()
    finally:
        if supervisor.stopping.is_set():
            log.info("stopped: mounts were unmounted and will come back with the next "
                     "supervisor")
        else:
            log.info("no mount is wanted; exiting")
        logging.shutdown()
        # the pid file goes last, so stop_supervisor can always wait for this process
        os.close(fd)
        with contextlib.suppress(OSError):
            pid_file.unlink()
    os._exit(0)


if __name__ == "__main__":
    main()
