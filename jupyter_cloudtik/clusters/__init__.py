"""Clusters: what creates, watches and ends nodes (the layer above placement).

Placement decides where nodes go; this package makes them exist through the providers.
It holds the cluster manager and its faces, as storage/ and hpc/ hold theirs: client
(in process), rest (over the server's API), commands, cli, magics, api, widgets, handlers.
"""
