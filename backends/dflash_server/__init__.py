"""`dflash-tune serve`: the dflash_core engine behind an OpenAI-compatible HTTP server.

`loop.EngineLoop` runs the engine on its own thread and batches concurrent requests into the
engine's live batch (continuous batching); `app.build_app` is the Starlette (ASGI) app;
`launch.serve` loads the checkpoints, runs the loop in this (the engine) process and the app
under uvicorn in a spawned front-end process (`front.py`), joined by a pipe (`bridge.py` on the
engine's side, `client.py` on the front end's); `--engine-thread` keeps both in one process.
"""
