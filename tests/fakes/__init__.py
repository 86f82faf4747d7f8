"""Real HTTP servers on 127.0.0.1 that stand in for outside services in tests."""
