"""Values people write in configs, magics and REST bodies: sizes (``2GiB``,
core/units.py ``parse_bytes``) and durations (``90``, ``2h``, ``1-00:00:00``,
hpc/base.py ``parse_duration``).

Properties: a size is a whole number of bytes, 0 or more, or a ``ConfigError`` naming the
field; a duration is a positive, finite number of seconds (or None for empty), or a
``ConfigError`` naming the field.  Nothing else escapes (no ``OverflowError`` for
``1e400``-sized numbers, no ``ValueError`` for 5000-digit ones).
"""

from __future__ import annotations

import math

from _harness import choose, instrumented, main, text

with instrumented():
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.core.units import (
        format_bytes,
        format_duration,
        parse_bytes,
        parse_duration,
    )


def one(data: bytes) -> None:
    which, rest = choose(data, 2)
    value = text(rest)
    if which == 0:
        try:
            n = parse_bytes(value, field="memory")
        except ConfigError as e:
            assert e.field == "memory", e.field
            return
        assert isinstance(n, int) and n >= 0, n
        format_bytes(n)
    else:
        try:
            s = parse_duration(value, field="walltime")
        except ConfigError as e:
            assert e.field == "walltime", e.field
            return
        if s is not None:
            assert isinstance(s, float) and s > 0 and math.isfinite(s), s
            format_duration(s)


if __name__ == "__main__":
    main(one)
