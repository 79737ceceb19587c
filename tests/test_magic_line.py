"""The magics read their line like a shell (``jupyter_cloudtik/magic_line.py``).

The splitting is checked against bash itself; the magics in a real IPython shell; and every
magic line of the README and docs that ends in a ``# comment`` must parse to the same
arguments as the line without it, so a documented line can never again fail when pasted.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from jupyter_cloudtik.clusters.commands import cluster_parser
from jupyter_cloudtik.hpc.commands import job_parser
from jupyter_cloudtik.hpc.magics import _cell_parser
from jupyter_cloudtik.hub.commands import sidekick_parser
from jupyter_cloudtik.magic_line import LineSyntaxError, split_line, split_magic_line
from jupyter_cloudtik.storage.commands import storage_parser

ROOT = Path(__file__).resolve().parent.parent

PARSERS = {
    "%cluster": lambda: cluster_parser("%cluster"),
    "%storage": lambda: storage_parser("%storage"),
    "%hpc": lambda: job_parser("%hpc"),
    "%%hpc": _cell_parser,
    "%sidekick": lambda: sidekick_parser("%sidekick"),
}

# lines without shell operators, $ or globs (those mean nothing to a magic, so they are
# left out of the comparison with bash)
SHELL_LINES = [
    "up --workers 4        # a Dask cluster, here, in about a second",
    "up --workers 4 # it's fast",
    "up --name a#b",
    "up --name a# # trailing",
    "status 'x # y'  # it's quoted",
    'status "x # y" "it\'s" \'say "hi"\'',
    "cp data:in\\ put ./in\\#put",
    'logs "a\\"b" "c\\\\d" "e\\f" x\\y',
    "list ''  \"\" -x''y",
    "ls data:#x",
    "#all of it a comment",
    "   ",
    "a\tb  c",
    "a'b c'd \"e f\"g",
]


def _bash_words(line: str) -> list[str]:
    script = f"set -f\nset -- {line}\nprintf '%s\\0' \"$#\" \"$@\"\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    count, *words = out.stdout.split("\0")[:-1]
    assert int(count) == len(words)
    return words


@pytest.mark.parametrize("line", SHELL_LINES)
def test_split_line_is_what_bash_passes_a_command(line):
    assert split_line(line) == _bash_words(line)


def test_a_quoting_error_names_its_column_and_problem():
    with pytest.raises(LineSyntaxError) as e:
        split_line("up --name 'abc")
    assert (e.value.problem, e.value.position) == ("unclosed ' quote", 10)
    with pytest.raises(UsageError) as e:
        split_magic_line("%cluster", "up --name 'abc")
    # "%cluster up --name 'abc": the quote is the 20th character
    assert str(e.value).startswith("%cluster: unclosed ' quote starting at column 20: 'abc")
    with pytest.raises(UsageError, match=r'^%hpc: unclosed " quote starting at column 15: "x y'):
        split_magic_line("%hpc", 'status a "x y')
    # an apostrophe in a word, not in a comment: the shell would wait for the quote too
    with pytest.raises(UsageError, match="unclosed ' quote starting at column 28"):
        split_magic_line("%cluster", "up --workers 4# it's fast")


# --- in a real IPython shell ---------------------------------------------------------------------

@pytest.fixture
def ip(state_dir, tmp_path, monkeypatch):
    """A real InteractiveShell with the magics of ``%load_ext jupyter_cloudtik``, without its
    launcher pre-start (a daemon this test does not need)."""
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_cloudtik.core.features import magics_classes

    monkeypatch.delenv("CLOUDTIK_API_URL", raising=False)
    monkeypatch.delenv("CLOUDTIK_HPC_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    for cls in magics_classes():
        shell.register_magics(cls)
    yield shell
    shell.user_ns.pop("c", None)
    from jupyter_cloudtik.hpc.client import forget_clients

    forget_clients()


def _command_names(prog: str) -> list[str]:
    parser = PARSERS[prog]()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return list(sub.choices)


@pytest.mark.parametrize("prog", ["%cluster", "%storage", "%hpc", "%sidekick"])
def test_a_magic_alone_or_help_lists_its_commands_one_line_each(ip, capsys, prog):
    names = _command_names(prog)
    for line in ("", "help", "   # what is there?"):
        assert ip.run_line_magic(prog[1:], line) is None
        out = capsys.readouterr().out.strip().splitlines()
        assert out[0].startswith(f"{prog} COMMAND")
        assert [row.split()[0] for row in out[1:]] == names, out
        assert all(len(row.split()) > 1 for row in out[1:]), "a command without its line"
    ip.run_line_magic(prog[1:], f"help {names[0]}")
    assert f"usage: {prog} {names[0]}" in capsys.readouterr().out


@pytest.mark.parametrize("prog,line,column", [
    ("%cluster", "up --name 'abc", 20),
    ("%storage", 'ls "data:x', 13),
    ("%hpc", "submit nb.ipynb -p who 'o'neil'", 36),
    ("%sidekick", "start 'x", 17),
])
def test_an_unclosed_quote_is_one_line_with_its_column(ip, capsys, prog, line, column):
    ip.run_cell(f"{prog} {line}")
    err = capsys.readouterr()
    text = err.out + err.err
    quote = "'" if line.count("'") % 2 else '"'
    assert f"UsageError: {prog}: unclosed {quote} quote starting at column {column}" in text
    assert "Traceback" not in text


def test_the_cell_magic_line_is_read_the_same_way(ip, capsys):
    ip.run_cell("%%hpc --name 'cell\nprint(1)\n")
    text = "".join(capsys.readouterr())
    assert "UsageError: %%hpc: unclosed ' quote starting at column 14" in text
    assert "Traceback" not in text
    ip.run_cell("%%hpc --nodes zero  # it's one cell\nprint(1)\n")
    assert "argument --nodes/-N: 'zero' is not a whole number" in "".join(capsys.readouterr())


def test_comments_and_hashes_in_words_reach_the_commands_right(ip, capsys):
    """Each line would fail (unrecognized arguments, or another name) if its comment were
    passed on or a # inside a word or quotes were cut."""
    assert "No clusters" in repr(ip.run_line_magic("cluster", "list   # it's empty"))
    for line, name in [("status a#b        # it's not there", "a#b"),
                       ("status 'x # y'  # quoted", "x # y")]:
        ip.run_cell(f"c = %cluster {line}")
        assert f"no cluster named '{name}'" in "".join(capsys.readouterr()), line
    ip.run_cell("%storage remove g#h   # it's gone")
    assert "no storage named 'g#h'" in "".join(capsys.readouterr())
    ip.run_cell("%hpc status feed#beef # it's mine")
    assert "no job 'feed#beef'" in "".join(capsys.readouterr())


# --- every documented line with a comment ---------------------------------------------------------

MAGIC_LINE = re.compile(r"^\s*(?:\w+\s*=\s*)?(%%?(?:cluster|storage|hpc|sidekick))\b(.*)$")


def documented_lines_with_comments() -> list[tuple[str, str, str]]:
    """(where, magic, line) for every magic line of README.md and docs/*.md ending in a
    ``# comment``."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, text in enumerate(path.read_text().splitlines(), 1):
            m = MAGIC_LINE.match(text)
            if m and re.search(r"\s#", m.group(2)):
                found.append((f"{path.relative_to(ROOT)}:{number}", m.group(1), m.group(2)))
    return found


def test_the_docs_have_magic_lines_with_comments():
    # a test of the lines below that finds none would pass for nothing
    assert len(documented_lines_with_comments()) >= 15


@pytest.mark.parametrize("where,prog,line", [
    pytest.param(*found, id=found[0]) for found in documented_lines_with_comments()])
def test_a_documented_line_parses_as_without_its_comment(where, prog, line):
    bare = re.split(r"\s#", line, maxsplit=1)[0]
    words = split_magic_line(prog, line)
    assert words == split_magic_line(prog, bare) and words, where
    parser = PARSERS[prog]
    assert parser().parse_args(words) == parser().parse_args(split_magic_line(prog, bare)), where
