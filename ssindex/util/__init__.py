"""Small helpers every layer may use: atomic files, Arrow views, user directories."""
