"""Clusters: what creates, watches and ends nodes (the layer above placement).

Placement decides where nodes go; this package makes them exist through the providers.
Today it holds the nodes a zone boots for a parent zone (``zone_nodes``); the cluster
manager and its faces move here when the tree is restructured (issue 16, "Layout").
"""
