"""Config files and the config part of REST bodies: a cluster config (YAML or JSON text,
core/config.py ``parse_config_text`` then ``build_config``: the schema, defaults, the
provider's own schema, cross-field rules) and the HPC backends file (hpc/settings.py).

Properties: nothing but a ``ConfigError`` that names a field escapes; a config that is
accepted is JSON (it is stored and hashed as JSON: ``config_hash`` works) and normalising it
again changes nothing (``build_config(cfg) == cfg``).
"""

from __future__ import annotations

from _harness import choose, instrumented, main, text

with instrumented():
    from jupyter_cloudtik.core.config import build_config, config_hash, parse_config_text
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.hpc.settings import parse_backends_text


def one(data: bytes) -> None:
    which, rest = choose(data, 2)
    source = text(rest)
    if which == 1:
        try:
            backends = parse_backends_text(source, "backends.yaml")
        except ConfigError as e:
            assert e.field, e
            return
        assert all(isinstance(k, str) and isinstance(v, dict) for k, v in backends.items())
        return
    try:
        raw = parse_config_text(source)
        cfg = build_config(raw)
    except ConfigError as e:
        assert e.field, e
        return
    config_hash(cfg)
    again = build_config(cfg)
    assert again == cfg, (cfg, again)


if __name__ == "__main__":
    main(one)
