"""The simulated serving engine: catalogs, engine core, virtual-time driver, argv parsing."""
