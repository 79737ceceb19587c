"""Node and workspace providers; each is an entry point in ``jupyter_cloudtik.providers``."""
