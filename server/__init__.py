"""Serving agents (ostinato-serve): HTTP with OpenAI's and Anthropic's API shapes, chat encoding, DSML tool
calls, sampling and constraints, the request queue, prefix-cached sessions and session files on disk.

Built on the runtime (an engine from a plan) and the shared core; nothing in the product imports it.
"""
