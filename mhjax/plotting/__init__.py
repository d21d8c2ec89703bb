"""Figures (matplotlib, Agg backend) of trained sweeps and their analysis."""
