"""The DeepSeek-V4 forward pass, written from DSV4.md section 3, with session KV caches."""
