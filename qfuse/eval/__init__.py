"""Accuracy evaluation."""
