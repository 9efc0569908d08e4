"""The stages of `task: translation` (tasks/stages.py): sentence pairs, a Chinese side in `text` (segmented by
the shared segment stage) and an English side in `en`, translated either way by the seq2seq models of
tasks/models/seq2seq.py."""
