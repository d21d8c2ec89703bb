"""Figures and Markdown summaries drawn from results.json records and TensorBoard curves."""
