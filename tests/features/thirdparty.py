"""A tiny third-party distribution, written into a folder that is then put on sys.path:
a package ``cloudtik_quota_demo`` with a ``dist-info`` declaring one
``jupyter_cloudtik.features`` entry point.  importlib.metadata finds it exactly as it
finds an installed wheel, so nothing of ours is edited to add it."""

from __future__ import annotations

from pathlib import Path

PACKAGE = '''
from jupyter_cloudtik.core.features import Feature

FEATURE = Feature(
    "quota-demo",
    magics=("cloudtik_quota_demo.faces:QuotaMagics",),
    cli=("cloudtik_quota_demo.faces",),
    routes=("cloudtik_quota_demo.handlers",),
    shutdown=("cloudtik_quota_demo.handlers:stopped",),
    migrations=(("quota_demo", "cloudtik_quota_demo.handlers:MIGRATIONS"),),
)
'''

FACES = '''
from IPython.core.magic import Magics, line_magic, magics_class

COMMANDS = {"quota-demo"}


def add_commands(sub):
    p = sub.add_parser("quota-demo", help="a third-party feature's command")
    p.add_argument("who")


def run(args):
    print(f"quota for {args.who}: 3")
    return 0


@magics_class
class QuotaMagics(Magics):
    @line_magic
    def quota_demo(self, line):
        return f"quota for {line.strip()}: 3"
'''

HANDLERS = '''
from tornado import web
from jupyter_server.auth.decorator import authorized

from jupyter_cloudtik.api.base import CloudTikHandler

EVENTS = []
MIGRATIONS = ["CREATE TABLE quota_demo (user TEXT PRIMARY KEY, quota INTEGER NOT NULL)"]


def startup(ctx):
    EVENTS.append("startup")


def stopped(ctx):
    EVENTS.append("shutdown")


class QuotaHandler(CloudTikHandler):
    @web.authenticated
    @authorized
    async def get(self, who):
        self.write_json({"user": who, "quota": 3, "events": EVENTS})


ROUTES = [(r"/quota-demo/(?P<who>[a-z]+)", QuotaHandler)]
'''


def write_distribution(root: Path) -> Path:
    pkg = root / "cloudtik_quota_demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(PACKAGE)
    (pkg / "faces.py").write_text(FACES)
    (pkg / "handlers.py").write_text(HANDLERS)
    # the entry point exactly as docs/architecture.md tells a third party to declare it
    import doc_examples

    fragment = doc_examples.block("docs/architecture.md", "Features register once "
                                  "(`core/features.py`, entry points `jupyter_cloudtik.features`)")
    return doc_examples.write_dist_info(root, "cloudtik_quota_demo", fragment.text)


def installed_in_process(root: Path, monkeypatch):
    """Put the distribution on this process's sys.path, with the registries' caches
    cleared so they read the entry points again; returns the function that forgets it
    again (call it after ``monkeypatch.undo()``)."""
    import sys

    from jupyter_cloudtik.core import features, plugins

    write_distribution(root)
    monkeypatch.syspath_prepend(str(root))

    def forget() -> None:
        plugins._entry_points.cache_clear()
        features.features.cache_clear()
        for name in [m for m in sys.modules if m.startswith("cloudtik_quota_demo")]:
            del sys.modules[name]

    forget()
    return forget
