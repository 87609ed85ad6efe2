"""Jinja2 templates for generated kernels (package data): triton/ for hot experts, cpu/ for cold."""
