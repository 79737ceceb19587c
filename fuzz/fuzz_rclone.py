"""What rclone prints, as the storage feature reads it (storage/rclone.py, storage/manager.py):
its log on stderr (JSON or text lines; the last error becomes the message people see), the
``--use-json-log`` stats lines of a running copy (the progress bar) and ``lsjson`` listings
(names come from the remote storage, so from anyone who can write there).

Properties: a failure's explanation is a ``StorageError`` and never holds a secret value the
redactor knows (nor its base64 form); a stats line is None or numbers that are finite and
not negative; a listing is a page or a ``StorageError`` — nothing else escapes.
"""

from __future__ import annotations

import base64
import json
import math

from _harness import choose, instrumented, main, output

with instrumented():
    from jupyter_cloudtik.core.secrets import Redactor
    from jupyter_cloudtik.storage.manager import listing_page
    from jupyter_cloudtik.storage.rclone import StorageError, explain_failure, parse_stats

SECRET = "s3cr3t-Key/42"
REDACT = Redactor([SECRET])
HIDDEN = (SECRET, base64.b64encode(SECRET.encode()).decode())


def one(data: bytes) -> None:
    which, rest = choose(data, 3)
    text = output(rest)
    if which == 0:
        # a line may carry the secret (rclone quoting a URL with its key): it must not show
        err = explain_failure("copy", text.replace("@SECRET@", SECRET), REDACT, 1)
        assert isinstance(err, StorageError)
        assert not any(h in str(err) for h in HIDDEN), str(err)
    elif which == 1:
        for line in text.splitlines():
            st = parse_stats(line)
            if st is None:
                continue
            d = st.to_dict()
            json.dumps(d, allow_nan=False)
            for k, v in d.items():
                assert v is None or (math.isfinite(v) and v >= 0), (k, v, line)
            f = st.fraction
            assert f is None or 0 <= f <= 1, f
    else:
        try:
            page = listing_page(rest, "folder", 0, 3)
        except StorageError:
            return
        json.dumps(page)
        assert len(page["entries"]) <= 3


if __name__ == "__main__":
    main(one)
