"""The loop: the engine, live batches, one decode round, fixed round shapes, CUDA graphs,
generation stats and the factory that assembles an engine from checkpoints."""
