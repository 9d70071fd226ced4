"""Schedulers: which requests an instance's `execute` receives, and when."""
