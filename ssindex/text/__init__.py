"""Text analysis shared by build and search: lexical terms and languages."""
