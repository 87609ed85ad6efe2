"""Kernel code generation: render jinja2 templates into a content-addressed build directory and compile."""
