"""The ``qfuse quantize`` / ``eval`` / ``info`` subcommands (one module each)."""
