"""Subcommands that are not producers or consumers: they work on files and streams."""
