"""Build the tiny real model pair: a Qwen3-style target trained on the Python standard library's
own source, and a DFlash drafter trained against it. See `build.build_pair`."""
