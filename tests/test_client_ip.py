"""``client_ip``'s dotted-quad fast path answers exactly what parsing the address does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flask_quota.core.identity import client_ip, parsed_ip

PART = st.one_of(
    st.integers(0, 300).map(str),
    st.sampled_from(["00", "01", "007", "0255", "-1", "", "1e2", "٣", "1 "]),
)


@given(parts=st.lists(PART, min_size=3, max_size=5), sep=st.sampled_from([".", ":", ". "]))
def test_dotted_quads_and_near_misses(parts: list[str], sep: str) -> None:
    address = sep.join(parts)
    assert client_ip(address) == parsed_ip(address)


def test_fast_path_cases() -> None:
    for address in ["1.2.3.4", "255.255.255.255", "0.0.0.0", "10.0.0.1"]:
        assert client_ip(address) == address
    assert client_ip("01.2.3.4") == "unknown"  # leading zeros are not an address
    assert client_ip("256.1.1.1") == "unknown"
    assert client_ip("1.2.3.4\n") == "unknown"
    assert client_ip("::ffff:1.2.3.4") == "1.2.3.4"
    assert client_ip(None) == "unknown"
