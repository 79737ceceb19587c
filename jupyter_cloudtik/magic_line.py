"""How every magic reads its line: the words of a shell command line, one parser for all.

``%cluster``, ``%storage``, ``%hpc``, ``%sidekick`` and the first line of ``%%hpc`` are
pasted from the README and the docs, where lines end in ``# what this does`` — so the line is
split the way a POSIX shell splits a simple command (XCU 2.3 "Token Recognition", 2.2
"Quoting"): blanks separate words; ``#`` *at the start of a word* begins a comment that runs
to the end of the line, while a ``#`` inside a word (``--name a#b``) or inside quotes stays
literal; ``'...'`` keeps everything literally, ``"..."`` lets a backslash escape only
``$ ` " \\``; a backslash outside quotes keeps the next character literal.  (``shlex`` with
``commenters='#'`` cuts ``a#b`` to ``a``, which no shell does.)  Shell operators, ``$`` and
globs mean nothing here: IPython has already expanded ``$var`` and ``{expr}``.

A quoting error names its column, counted in the magic's own text (``%cluster up ...``, the
``%`` being column 1), and is a one-line ``UsageError`` — never a traceback.  A magic alone
(or ``help``) lists its commands, one line each; ``help COMMAND`` is ``COMMAND --help``.
"""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError

from .core.arguments import UsageProblem

_BLANKS = " \t\n\r"
_DQUOTE_ESCAPES = '$`"\\\n'


class LineSyntaxError(ValueError):
    """A line that cannot be split into words; ``position`` is the 0-based index of the fault."""

    def __init__(self, problem: str, position: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.position = position


def split_line(line: str) -> list[str]:
    """The words of ``line`` as a POSIX shell would pass them to a command (see the module)."""
    words: list[str] = []
    word: list[str] = []
    in_word = False  # a word has begun (it may still be empty: ``''``)
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch in _BLANKS:
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            i += 1
        elif ch == "#" and not in_word:
            break  # a comment, to the end of the line (a magic's line is one line)
        elif ch == "\\":
            if i + 1 < n:
                if line[i + 1] != "\n":  # backslash-newline joins the lines
                    word.append(line[i + 1])
                    in_word = True
                i += 2
            else:  # a trailing backslash escapes nothing: the shell keeps it
                word.append(ch)
                in_word = True
                i += 1
        elif ch == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise LineSyntaxError("unclosed ' quote", i)
            word.append(line[i + 1:end])
            in_word = True
            i = end + 1
        elif ch == '"':
            j = i + 1
            while True:
                if j >= n:
                    raise LineSyntaxError('unclosed " quote', i)
                c = line[j]
                if c == '"':
                    break
                if c == "\\" and j + 1 < n and line[j + 1] in _DQUOTE_ESCAPES:
                    if line[j + 1] != "\n":
                        word.append(line[j + 1])
                    j += 2
                    continue
                word.append(c)
                j += 1
            in_word = True
            i = j + 1
        else:
            word.append(ch)
            in_word = True
            i += 1
    if in_word:
        words.append("".join(word))
    return words


def split_magic_line(prog: str, line: str) -> list[str]:
    """:func:`split_line`, a fault being a ``UsageError`` naming its column in ``prog line``."""
    try:
        return split_line(line)
    except LineSyntaxError as e:
        column = len(prog) + 1 + e.position + 1  # "%cluster " precedes the line; 1-based
        fragment = line[e.position:e.position + 30]
        raise UsageError(
            f"{prog}: {e.problem} starting at column {column}: {fragment}  (close it, or put "
            f"a \\ before a quote that is part of a word, e.g. it\\'s)") from None


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def command_list(prog: str, parser: argparse.ArgumentParser) -> str:
    """One line per command of ``parser``: what a magic alone (or ``help``) prints."""
    sub = _subcommands(parser)
    if sub is None:
        return parser.format_usage()
    rows = []
    for choice in sub._choices_actions:
        text = " ".join((choice.help or "").split())
        # the first clause: the details are in `PROG COMMAND --help`
        for cut in (" (", "; ", ": "):
            if cut in text:
                text = text[:text.index(cut)]
        rows.append((choice.dest, text))
    width = max(len(name) for name, _ in rows)
    lines = [f"{prog} COMMAND ...  (`{prog} COMMAND --help`: its options; a trailing "
             "# comment is ignored)"]
    lines += [f"  {name:<{width}}  {text}".rstrip() for name, text in rows]
    return "\n".join(lines)


def parse_magic_line(prog: str, parser: argparse.ArgumentParser, line: str,
                     commands: bool = True) -> argparse.Namespace | None:
    """Split ``line`` like a shell and parse it with ``parser``.

    ``None`` means nothing is left to do: help was printed (``--help``, or with ``commands``,
    the magic alone or ``help``: its command list).  Every problem is a one-line
    ``UsageError`` naming the bad word or column.
    """
    words = split_magic_line(prog, line)
    if commands and (not words or words == ["help"]):
        print(command_list(prog, parser))
        return None
    if commands and len(words) == 2 and words[0] == "help":
        words = [words[1], "--help"]
    try:
        return parser.parse_args(words)
    except UsageProblem as e:
        raise UsageError(str(e)) from None
    except SystemExit:  # --help printed its text
        return None
