"""Process helpers both services run, none of which talks to Redis: the settings framework,
rate-limited logging, the collector and event-loop watchers, the fair push queue, and the
embedded Redis-compatible server `dev` starts."""
