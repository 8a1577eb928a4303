"""What to draft (Spec, SamplingParams, proposers) and how a tree is built, verified, accepted
and sampled. Imports only models/; spec.py imports no torch, so this file imports nothing."""
