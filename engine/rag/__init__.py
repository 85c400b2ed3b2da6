"""Chat with your documents: the Qt-free core of local document collections.

A collection is a set of folders and files on this machine. `files` walks them (skipping what
cannot or should not be read, each with a reason for the user), `extract` turns one file into
text with its pages and headings, and `chunking` cuts that text into overlapping pieces sized
in the embedding model's tokens. `store`, `indexer` and `search` keep those chunks in SQLite
with their vectors and full-text index, index incrementally, and answer hybrid queries.
"""
