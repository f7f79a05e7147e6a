"""One module per ``robot-rl`` subcommand; each exposes ``main(argv) -> int``."""
