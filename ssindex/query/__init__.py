"""The query side: the searcher, its dense leg and rank fusion. It never imports the build."""
