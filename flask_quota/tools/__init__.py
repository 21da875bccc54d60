"""Operator tools: inspection, blocks and the dashboard's usage counts."""
