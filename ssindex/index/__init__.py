"""The on-disk format, read by build and search alike: layout, Lance table, search files."""
