"""Emulators and real services for tests and demos (Slurm, FirecREST, ARC, ...)."""
