"""The shared API layer under both hosts: the single-user server extension (``server/``)
and the JupyterHub sidekick (``hub/``), which never import each other.

``base`` (the handler every route derives from: auth, JSON errors, body checks),
``openapi`` (the document's schemas), ``sse`` (event streams), ``forward`` (passing a
request on), ``settings`` (``c.CloudTikServer.*``) and ``routes`` (the REST routes,
assembled from the ``routes`` of the ``jupyter_cloudtik.features`` entry points).
"""
