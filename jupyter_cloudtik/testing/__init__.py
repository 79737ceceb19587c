"""Emulators of services that tests cannot reach, shipped so users can dry-run too."""
