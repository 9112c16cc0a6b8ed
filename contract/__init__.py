"""The contract gateway and worker share, with no Redis in it: what the logs carry (typed
commands and events and their codec), how a log is followed exactly once and in order, model
names, and why a session ended. It imports no Redis client, no event loop and neither
service."""
