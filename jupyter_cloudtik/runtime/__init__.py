"""What runs on a cluster's nodes (Dask) and how the core talks to it."""
