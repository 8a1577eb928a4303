"""`python -m backends.dflash_server --target DIR ...`: our server, started without the tuner."""

from backends.dflash_server.cli import main

main()
