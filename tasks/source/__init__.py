"""Sources of corpora, shared by every task kind's download stage: `schema` (the `source` section
and its partitions), `fetch` (HTTP with limits and checks), `archives` (unpacking within limits) and
`readers` (decoding and parsing files into rows, and what cannot be read)."""
