"""Where an async call's callback URL may point: public addresses only, unless the operator opened a network."""

from __future__ import annotations

import ipaddress

import pytest

from sless_api.asynccalls.callback import CallbackPolicy, CallbackRefused, check_url, shown_url

OPEN = CallbackPolicy()


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/hook", "http://127.1/hook", "http://0.0.0.0/hook", "http://10.1.2.3/hook",
    "http://172.16.0.1/hook", "http://192.168.1.1:8080/hook", "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/hook", "http://[::1]/hook", "http://[::ffff:127.0.0.1]/hook", "http://[fe80::1]/hook",
    "http://[fd00::1]/hook", "http://224.0.0.1/hook", "http://localhost/hook", "http://LocalHost:9/hook",
])  # fmt: skip
def test_private_loopback_link_local_and_metadata_addresses_are_refused(url: str) -> None:
    with pytest.raises(CallbackRefused, match="not a public address"):
        check_url(url, OPEN)


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://8.8.8.8/x", "http:// or https://"), ("file:///etc/passwd", "http:// or https://"),
    ("gopher://8.8.8.8/", "http:// or https://"), ("http://user:pw@8.8.8.8/", "credentials"),
    ("http://user@8.8.8.8/", "credentials"), ("http:///nohost", "no host"), ("http://8.8.8.8:99999/", "port"),
    ("http://8.8.8.8:0/", "port"), ("http://8.8.8.8/" + "a" * 2100, "longer than"),
    ("http://8.8.8.8/a b", "without spaces"), ("http://8.8.8.8/\u00e9", "ASCII"),
    ("http://8.8.8.8/\r\nX: y", "control"),
    ("http://no-such-host.invalid/", "does not resolve"),
])  # fmt: skip
def test_malformed_urls_are_refused_with_the_reason(url: str, why: str) -> None:
    with pytest.raises(CallbackRefused, match=why):
        check_url(url, OPEN)


def test_public_literals_pass_and_an_allowed_network_opens_a_private_one() -> None:
    assert check_url("https://8.8.8.8/hook?token=x", OPEN) == "https://8.8.8.8/hook?token=x"
    assert check_url("http://[2001:4860:4860::8888]:8443/h", OPEN)
    local = CallbackPolicy(allowed_nets=CallbackPolicy.parse_nets("127.0.0.0/8, 10.9.0.0/16"))
    assert check_url("http://127.0.0.1:8080/hook", local)
    assert check_url("http://[::ffff:10.9.1.1]/hook", local)  # the IPv4-mapped spelling is the same address
    with pytest.raises(CallbackRefused):
        check_url("http://10.8.0.1/hook", local)


def test_allowed_networks_are_parsed_strictly() -> None:
    assert CallbackPolicy.parse_nets("") == ()
    assert CallbackPolicy.parse_nets(" 10.0.0.0/8 ,") == (ipaddress.ip_network("10.0.0.0/8"),)
    for bad in ("10.0.0.1/8", "not-a-net", "10.0.0.0/33"):
        with pytest.raises(ValueError, match="SLESS_CALLBACK_ALLOWED_NETS"):
            CallbackPolicy.parse_nets(bad)


def test_the_record_shows_the_url_without_its_query() -> None:
    assert shown_url("https://hooks.example.com:8443/a/b?token=secret#x") == "https://hooks.example.com:8443/a/b"
