"""The magic line parser (jupyter_cloudtik/magic_line.py): every ``%cluster``/``%storage``/
``%hpc``/``%sidekick`` line a user types or pastes.

Properties: ``split_line`` raises nothing but ``LineSyntaxError`` (with a position inside the
line); words quoted the shell's way split back into the same words (``split(quote(w)) ==
w``); a whole magic line through the real command parsers raises nothing but IPython's
one-line ``UsageError``.
"""

from __future__ import annotations

import contextlib
import io
import shlex

import atheris
from _harness import choose, instrumented, main, text

with instrumented():
    from IPython.core.error import UsageError

    from jupyter_cloudtik.clusters.magics import _parser as cluster_parser
    from jupyter_cloudtik.hpc.commands import job_parser
    from jupyter_cloudtik.magic_line import LineSyntaxError, parse_magic_line, split_line
    from jupyter_cloudtik.storage.commands import storage_parser

PARSERS = [("%cluster", cluster_parser()), ("%storage", storage_parser("%storage")),
           ("%hpc", job_parser("%hpc"))]


def one(data: bytes) -> None:
    which, rest = choose(data, 3)
    if which == 0:  # any text
        line = text(rest)
        try:
            words = split_line(line)
        except LineSyntaxError as e:
            assert 0 <= e.position < len(line), (e.position, line)
            return
        assert all(isinstance(w, str) for w in words)
        # what was split, quoted again, splits into the same words
        again = split_line(" ".join(shlex.quote(w) for w in words))
        assert again == words, (line, words, again)
    elif which == 1:  # words -> a quoted line -> the same words
        fdp = atheris.FuzzedDataProvider(rest)
        words = [fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
                 for _ in range(fdp.ConsumeIntInRange(0, 6))]
        line = " ".join(shlex.quote(w) for w in words)
        assert split_line(line) == words, (words, line)
    else:  # a whole magic line through the commands' parsers
        which, rest = choose(rest, len(PARSERS))
        prog, parser = PARSERS[which]
        line = text(rest)
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            try:
                parse_magic_line(prog, parser, line)
            except UsageError as e:
                assert "Traceback" not in str(e)


if __name__ == "__main__":
    main(one)
