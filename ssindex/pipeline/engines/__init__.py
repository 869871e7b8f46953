"""Engines turn a ``BuildPlan`` into execution: ``local`` (threads) and ``ray`` (Ray Data)."""
