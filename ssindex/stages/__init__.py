"""Pipeline stages: walk → chunk → dedupe → embed → quantize → write.

Each stage is a function over an iterator of typed rows or batches; none knows
the CLI or the engine that runs it.
"""
