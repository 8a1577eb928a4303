"""Optuna studies, the results DB and the dflash-tune CLI."""
