"""Images and audio in a prompt: decoding what a client sends (engine.media.images,
engine.media.audio) and the prompt whose media chunks the decode loop reads as embeddings
(engine.media.prompt)."""
