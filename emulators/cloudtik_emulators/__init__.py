"""Helpers users can run too: process checks for tests, API emulators of clouds and HPC
services (FirecREST, ARC), and a real single-node Slurm in a folder."""
