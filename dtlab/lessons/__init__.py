"""Functions that lessons run on ranks (spawned ranks can only run code from the package)."""
