"""The build DAG: stage specs, the engines that run them, and the build driver."""
