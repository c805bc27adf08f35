"""500 concurrent streaming sessions through one proxy process for 2 minutes: nothing lost,
memory flat. (The 10-minute soak is `python -m loadtests.soak`, run by hand.)"""

from __future__ import annotations

import pytest

from loadtests.soak import run_soak

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_500_streaming_sessions_for_two_minutes():
    result = await run_soak(sessions=500, seconds=120.0)
    print("\n" + result.report())
    assert result.requests > 2000
    assert result.failed == 0, result.errors
    # Bound: no leak. After warm-up the proxy may grow by allocator noise, not per request.
    assert result.rss_growth_kib() < 48 * 1024, result.rss_kib
