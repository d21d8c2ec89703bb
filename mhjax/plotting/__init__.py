"""Figures and Markdown: every PNG and report table mhjax writes."""
