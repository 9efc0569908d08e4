"""Plain utilities the stages and models use: files and chunks, process pools, progress, pictures,
URLs with credentials, hub loading, tokens, word vectors, paired scores and the word segmenter."""
