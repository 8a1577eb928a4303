"""Measured kernel latencies (NVIDIA AIConfigurator's silicon tables) and their interpolation."""
