"""Evaluation: trained policies against the baselines, automatic metrics, reports and plots."""
