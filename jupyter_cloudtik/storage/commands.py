"""The storage sub-commands, defined once for ``%storage`` and ``jupyter cloudtik storage``,
and the code both faces run (they differ only in how they show results and errors)."""

from __future__ import annotations

import argparse
import getpass
import html
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ..core.arguments import Parser
from ..core.errors import ConfigError
from ..core.units import format_bytes
from .settings import VFS_CACHE_MODES


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def add_storage_commands(sub, cli: bool) -> None:
    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        if cli:
            p.add_argument("--json", action="store_true", help="print JSON")
        return p

    p = add("add", "add a storage (an rclone remote) to the catalog")
    p.add_argument("name", help="storage name (letters, digits, - and _)")
    p.add_argument("url", nargs="?",
                   help="short form: s3://bucket/path, obs://bucket/path, "
                        "webdav+https://host/path, sftp://user@host/path")
    p.add_argument("--backend", "-b", help="rclone backend type (s3, webdav, sftp, ...)")
    p.add_argument("--option", "-o", action="append", type=_key_value, default=[],
                   metavar="KEY=VALUE", help="a backend option (repeat)")
    p.add_argument("--ask", action="append", default=[], metavar="KEY",
                   help="ask for this (secret) option without echoing it (repeat)")
    p.add_argument("--from-env", action="append", type=_key_value, default=[],
                   metavar="KEY=VAR", help="take this option's value from environment "
                   "variable VAR (keeps secrets off the command line; repeat)")
    p.add_argument("--source", "-s", help="path inside the remote (bucket first)")
    p.add_argument("--read-write", action="store_true",
                   help="allow writes (storages are read-only by default)")
    p.add_argument("--mount-path", help="where to mount it (inside the working folder)")
    p.add_argument("--vfs-cache-mode", choices=VFS_CACHE_MODES, help="rclone VFS cache mode")
    p.add_argument("--description", default="", help="a note shown in lists")
    p.add_argument("--replace", action="store_true", help="replace a storage of that name")

    add("list", "list storages and their mounts")

    p = add("ls", "list a storage folder (NAME:path)")
    p.add_argument("location", help="NAME: or NAME:path")
    p.add_argument("--recursive", "-R", action="store_true")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=200)

    for cmd, help_ in (("cp", "copy SRC into DST (NAME:path or a local path)"),
                       ("sync", "make DST like SRC, deleting extra files in DST")):
        p = add(cmd, help_)
        p.add_argument("src")
        p.add_argument("dst")
        p.add_argument("--no-wait", action="store_true",
                       help="return once the operation has started")

    p = add("mount", "mount a storage at its mount path (FUSE, supervised)")
    p.add_argument("name")
    p.add_argument("--mode", choices=("fuse", "sync"), default="fuse",
                   help="fuse (default) or sync: copy the data there instead")

    p = add("unmount", "unmount a storage")
    p.add_argument("name")

    p = add("remove", "unmount and forget a storage and its credentials")
    p.add_argument("name")

    p = add("test", "check that a storage answers with its credentials")
    p.add_argument("name")

    add("backends", "rclone backends that may be added here")

    p = add("options", "the options of an rclone backend")
    p.add_argument("backend")
    p.add_argument("--provider", help="s3-style provider, e.g. AWS, HuaweiOBS, Minio")
    p.add_argument("--all", action="store_true", help="include advanced options")


def storage_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, add_help=True)
    sub = parser.add_subparsers(dest="storage_command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    add_storage_commands(sub, cli=False)
    return parser


# --------------------------------------------------------------------------- rendering
class StorageList(list):
    """Storages with a table view in notebooks and terminals."""

    COLUMNS = ("name", "backend", "source", "access", "mount")

    def rows(self) -> list[tuple[str, ...]]:
        out = []
        for s in self:
            m = s.mount or {}
            mount = f"{m.get('state')} ({m.get('mode')}) at {m.get('mount_path')}" if m else "-"
            out.append((s.name, s.backend, s.source or "/",
                        "read-only" if s.read_only else "read-write", mount))
        return out

    def __repr__(self) -> str:
        if not self:
            return "no storages; add one with `%storage add NAME URL`"
        return _text_table(self.COLUMNS, self.rows())

    def _repr_html_(self) -> str:
        if not self:
            return "<i>no storages</i>"
        return _html_table(self.COLUMNS, self.rows())


class Listing(dict):
    def __repr__(self) -> str:
        rows = [(("d " if e["is_dir"] else "- ") + e["name"],
                 "" if e["is_dir"] else format_bytes(e["size"]), (e["mod_time"] or "")[:19])
                for e in self["entries"]]
        more = (f"\n… {self['total'] - self['next_offset']} more (--offset "
                f"{self['next_offset']})" if self.get("next_offset") else "")
        head = f"{self['storage']}:{self['path']}  ({self['total']} entries)\n"
        return head + (_text_table(("name", "size", "modified"), rows) if rows else
                       "(empty)") + more

    def _repr_html_(self) -> str:
        rows = [(("📁 " if e["is_dir"] else "") + e["name"],
                 "" if e["is_dir"] else format_bytes(e["size"]), (e["mod_time"] or "")[:19])
                for e in self["entries"]]
        head = (f"<b>{html.escape(self['storage'])}:{html.escape(self['path'])}</b> "
                f"({self['total']} entries)")
        return head + _html_table(("name", "size", "modified"), rows)


def _text_table(cols, rows) -> str:
    widths = [max(len(c), *(len(str(r[i])) for r in rows)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*(c.upper() for c in cols)),
                      *(fmt.format(*map(str, r)) for r in rows)])


def _html_table(cols, rows) -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(v))}</td>"
                                    for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _options_text(schema: dict[str, Any], show_all: bool) -> str:
    lines = [f"{schema['backend']}: {schema['description']}"]
    if schema.get("providers"):
        lines.append(f"providers: {', '.join(schema['providers'])}")
    for o in schema["options"]:
        if o["advanced"] and not show_all:
            continue
        flags = [o["type"]] + (["required"] if o["required"] else []) + (
            ["secret"] if o["secret"] else []) + (["advanced"] if o["advanced"] else [])
        first = (o["help"] or "").strip().splitlines()
        lines.append(f"  {o['name']:28} {', '.join(flags):26} {first[0] if first else ''}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- running
def run_command(args: argparse.Namespace, client: Any, follow: Callable[[str, str], Any],
                ask: Callable[[str], str] = getpass.getpass, out=None,
                add_by_user: Callable[..., Any] | None = None) -> Any:
    """Run one parsed storage command; ``follow(op_id, title)`` shows an operation.

    ``add_by_user(client, args, request, checked)``: how an add this face may not make
    itself is made by the user (a notebook's kernel: the form in the cell); it is called
    once the request has been checked, and returns the storage."""
    out = out or sys.stdout
    cmd = args.storage_command
    if cmd == "add":
        options = dict(args.option)
        for key, var in args.from_env:
            if var not in os.environ:
                raise ConfigError(f"--from-env {key}={var}: the environment variable {var} "
                                  "is not set", field=f"options.{key}")
            options[key] = os.environ[var]
        if not args.url and not args.backend:
            raise ConfigError("add: give a URL (s3://bucket, webdav+https://...) or --backend",
                              field="backend")
        kw = {"url": args.url, "source": args.source, "read_only": not args.read_write,
              "mount_path": args.mount_path, "vfs_cache_mode": args.vfs_cache_mode,
              "description": args.description, "replace": args.replace}
        if args.ask or add_by_user is not None:
            # the add's own checks, nothing saved, before anyone types a secret: a typo is
            # answered now (and a kernel, which may not add, is answered at all)
            checked = client.check_add(args.name, args.backend, options, ask=args.ask, **kw)
        if add_by_user is not None:
            # deferred: start-up (storage.rest ~38 ms, loads requests, urllib3)
            from .rest import add_body

            given = {k: v for k, v in options.items() if k not in args.ask}
            request = add_body(args.name, args.backend, given, **kw)
            return ("shown", add_by_user(client, args, request, checked))
        for key in args.ask:
            options[key] = ask(f"{key} for storage {args.name}: ")
        info = client.add(args.name, args.backend, options, **kw)
        return ("storage", info)
    if cmd == "list":
        return ("list", StorageList(client.list()))
    if cmd == "ls":
        return ("ls", Listing(client.ls(args.location, offset=args.offset, limit=args.limit,
                                        recursive=args.recursive)))
    if cmd in ("cp", "sync"):
        mode = "copy" if cmd == "cp" else "sync"
        op_id = client.start_copy(args.src, args.dst, mode=mode)
        if args.no_wait:
            return ("started", {"operation": op_id})
        return ("transfer", follow(op_id, f"{cmd} {args.src} → {args.dst}"))
    if cmd == "mount":
        op_id = client.start_mount(args.name, mode=args.mode)
        return ("mount", follow(op_id, f"mount {args.name}"))
    if cmd == "unmount":
        return ("unmount", follow(client.start_unmount(args.name), f"unmount {args.name}"))
    if cmd == "remove":
        client.remove(args.name)
        return ("removed", {"removed": args.name})
    if cmd == "test":
        return ("test", client.test(args.name))
    if cmd == "backends":
        return ("backends", client.backends())
    if cmd == "options":
        return ("options", (client.backend_schema(args.backend, args.provider), args.all))
    raise AssertionError(cmd)  # pragma: no cover


def describe(kind: str, value: Any) -> str:
    """The text both faces print for a command's result."""
    if kind == "storage":
        d = value.to_dict()
        return (f"storage {value.name!r}: {value.backend} {value.source or '/'} "
                f"({'read-only' if value.read_only else 'read-write'}), mount path "
                f"{value.mount_path}; options: {json.dumps(d['options'])}")
    if kind in ("list", "ls"):
        return repr(value)
    if kind == "transfer":
        return (f"{value['mode']} {value['src']} → {value['dst']}: "
                f"{format_bytes(value['bytes'])} in {value['files']} file(s), "
                f"{value['seconds']:.1f}s"
                + (f", {format_bytes(int(value['throughput']))}/s"
                   if value.get("throughput") else ""))
    if kind == "mount":
        if value.get("mode") == "sync":
            return f"{value['name']}: a copy is in {value['mount_path']} (sync mode)"
        return f"{value['name']} is mounted at {value['mount_path']}"
    if kind == "unmount":
        return f"{value['name']} is unmounted"
    if kind == "removed":
        return f"storage {value['removed']!r} removed"
    if kind == "test":
        return (f"storage {value['name']!r} answers: {value['entries']} entries at its source "
                f"({value['seconds']:.2f}s)")
    if kind == "started":
        return f"started operation {value['operation']}"
    if kind == "backends":
        return "\n".join(f"{b['name']:24} {b['description']}" for b in value)
    if kind == "options":
        return _options_text(*value)
    return str(value)


def as_json(kind: str, value: Any) -> Any:
    if kind == "storage":
        return value.to_dict()
    if kind == "list":
        return [s.to_dict() for s in value]
    if kind == "options":
        return value[0]
    return value
