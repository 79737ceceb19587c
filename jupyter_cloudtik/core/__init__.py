"""The core: state, operations, managers. Imports nothing from Jupyter's server or UI."""
