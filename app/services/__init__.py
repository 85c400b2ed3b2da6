"""Qt-free services: model library, chat store, hub downloads, settings, secrets."""
