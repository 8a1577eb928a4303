"""`dflash-tune serve`: the dflash_core engine behind an OpenAI-compatible HTTP server.

`loop.EngineLoop` runs the engine on its own thread and batches concurrent requests into the
engine's live batch (continuous batching); `app.build_app` is the Starlette (ASGI) app;
`launch.serve` loads the checkpoints and runs it under uvicorn.
"""
