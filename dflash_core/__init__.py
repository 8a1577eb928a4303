"""DFlash + DDTree speculative-decoding engine (PyTorch).

This package imports nothing from ``tuner``, ``backends`` or ``search_spaces``. Its engine
arrives with the dflash_core issues; until then it is intentionally empty.
"""
