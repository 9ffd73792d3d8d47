"""Search: query parsing, the vector and lexical lists and their fusion, rerank, MMR, the retrieval pipeline."""
