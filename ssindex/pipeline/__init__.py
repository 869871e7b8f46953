"""The build: one plan of it (``plan``), the engines that run the plan, and the driver
(``build``) that locks the index, runs an engine and commits the result."""
