"""The OpenAI-compatible server for agents: chat encoding, DSML tool calls, prefix-cached sessions."""
