"""Commands beyond build and search: the MCP server, eval, calibrate, doctor, terminal output."""
