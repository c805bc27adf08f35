"""1000+ malformed bodies: each gets an OpenAI-shaped 4xx, and the proxy keeps serving."""

from __future__ import annotations

import http.client
from urllib.parse import urlparse

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
bad_messages = (
    json_scalars
    | st.lists(json_scalars, min_size=1, max_size=3)
    | st.lists(
        st.fixed_dictionaries(
            {
                "role": json_scalars.filter(lambda v: not isinstance(v, str))
                | st.lists(json_scalars, max_size=2)
            }
        ),
        min_size=1,
        max_size=3,
    )
    | st.lists(
        st.fixed_dictionaries(
            {
                "role": st.just("user"),
                "content": st.integers(-(2**53), 2**53)
                | st.dictionaries(st.text(max_size=3), json_scalars, max_size=2),
            }
        ),
        min_size=1,
        max_size=3,
    )
)


def _not_json(b: bytes) -> bool:
    try:
        orjson.loads(b)
    except orjson.JSONDecodeError:
        return True
    return False


malformed = st.one_of(
    st.binary(max_size=200).filter(_not_json),
    json_values.filter(lambda v: not isinstance(v, dict)).map(orjson.dumps),
    st.dictionaries(
        st.text(max_size=8).filter(lambda k: k != "model"), json_values, max_size=4
    ).map(orjson.dumps),
    st.fixed_dictionaries(
        {
            "model": json_scalars.filter(lambda v: not isinstance(v, str) or v == ""),
            "messages": json_values,
        }
    ).map(orjson.dumps),
    st.fixed_dictionaries({"model": st.just("sim-model"), "messages": bad_messages}).map(
        orjson.dumps
    ),
    st.fixed_dictionaries(
        {
            "model": st.just("sim-model"),
            "messages": st.just([]),
            "stream": json_scalars.filter(lambda v: v is not None and not isinstance(v, bool)),
        }
    ).map(orjson.dumps),
)


def test_malformed_bodies_get_openai_4xx_and_a_good_request_still_works(proxy):
    url = urlparse(proxy.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    seen = []

    @settings(
        max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(body=malformed)
    def one(body: bytes) -> None:
        conn.request(
            "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        raw = resp.read()
        assert 400 <= resp.status < 500, (resp.status, body[:200], raw[:200])
        err = orjson.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        seen.append(resp.status)

    one()
    assert len(seen) >= 1000
    good = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "still there?"}],
        "max_tokens": 2,
    }
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=orjson.dumps(good),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    assert orjson.loads(resp.read())["choices"]
    conn.close()
