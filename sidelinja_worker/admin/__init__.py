"""The admin web view: job lists, job pages, actions, live events, metrics."""
