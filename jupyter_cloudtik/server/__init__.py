"""The REST API of jupyter_cloudtik as a Jupyter server extension (see ``extension.py``)."""
