"""docs/huaweicloud.md's credentials file, filled in, as the provider reads it."""

from __future__ import annotations

import doc_examples

from jupyter_cloudtik.providers.huaweicloud.credentials import read_profile

VALUES = {"access_key": "AKEXAMPLE0123", "secret_key": "sk-Example_0123",
          "project_id": "0123456789abcdef0123456789abcdef", "endpoint": "http://127.0.0.1:9"}


def test_the_credentials_file_of_the_doc(tmp_path, monkeypatch):
    """Its ``...`` replaced by a user's values; the comments after them stay, as a user
    copying the doc leaves them."""
    block = doc_examples.block("docs/huaweicloud.md", "Credentials", lang="ini")
    lines = []
    for line in block.text.splitlines():
        key = line.split("=", 1)[0].strip()
        lines.append(line.replace("...", VALUES[key], 1) if "..." in line else line)
    path = tmp_path / "credentials"
    path.write_text("\n".join(lines) + "\n")
    creds = read_profile("default", path)
    assert (creds.access_key, creds.secret_key, creds.project_id) == (
        VALUES["access_key"], VALUES["secret_key"], VALUES["project_id"])
    assert creds.extra == {"region": "cn-north-4", "endpoint": VALUES["endpoint"]}
