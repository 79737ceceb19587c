"""Helpers users can run too: process checks for tests, and API emulators of clouds."""
