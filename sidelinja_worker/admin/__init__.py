"""The admin web view (issue 5): job lists, job pages, actions, live events, metrics."""
