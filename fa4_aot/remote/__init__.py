"""Talking to an fa4-aot server: the HTTP client and its answer checks, stored tokens, push and pull, and
waiting for an on-demand build."""
