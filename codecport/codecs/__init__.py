"""The built-in codecs, one package each, its modules named by role (docs/architecture.md,
"Adding a codec"). The registry finds them by listing this folder; nothing here imports them."""
