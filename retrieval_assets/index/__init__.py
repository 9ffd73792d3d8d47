"""Indexing: chunker, embedders, the chunk table and its sync, the BM25 postings."""
