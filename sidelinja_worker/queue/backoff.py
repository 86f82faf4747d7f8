"""The seed's retry backoff: 30 s × 2^(attempts−1), so 30 s, 60 s, 120 s…"""

BASE_S = 30.0
MAX_S = 6 * 3600.0  # so a job with max_attempts=30 does not wait for years


def backoff_s(attempt: int) -> float:
    """Delay before the retry that follows failed attempt number `attempt` (1-based)."""
    return min(BASE_S * 2.0 ** max(attempt - 1, 0), MAX_S)
