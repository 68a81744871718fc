"""Where an async call's callback URL may point: public addresses only, unless the operator opened a network."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sless_api.services.asynccalls.callback import CallbackPolicy, CallbackRefused, check_url, shown_url

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


# IPv6 spellings that carry an IPv4 address are judged by it (the tunnel forms also as IPv6).
EMBEDDED = [
    # IPv4-mapped
    ("::ffff:127.0.0.1", False), ("::FFFF:7F00:1", False), ("0:0:0:0:0:ffff:a9fe:a9fe", False),
    ("::ffff:8.8.8.8", True),
    # IPv4-compatible (deprecated, RFC 4291)
    ("::127.0.0.1", False), ("::7f00:1", False), ("::0:7F00:0001", False), ("::10.0.0.1", False),
    ("::169.254.169.254", False), ("::8.8.8.8", True), ("::", False), ("::1", False),
    # IPv4-translated (RFC 2765)
    ("::ffff:0:127.0.0.1", False), ("::ffff:0:8.8.8.8", True),
    # NAT64 well-known prefix: the last 32 bits
    ("64:ff9b::127.0.0.1", False), ("64:ff9b::7f00:1", False), ("64:FF9B::A9FE:A9FE", False),
    ("64:ff9b::10.0.0.1", False), ("64:ff9b::192.168.1.1", False), ("64:ff9b::100.64.0.1", False),
    ("0064:ff9b:0000:0000:0000:0000:0808:0808", True), ("64:ff9b::8.8.8.8", True),
    # NAT64 local use (RFC 8215): refused whole, whatever it seems to embed
    ("64:ff9b:1::8.8.8.8", False), ("64:ff9b:1:ffff::1", False), ("64:FF9B:1:0808:0800::", False),
    # 6to4: bits 16-48
    ("2002:7f00:1::1", False), ("2002:7F00:0001::", False), ("2002:a9fe:a9fe::1", False),
    ("2002:c0a8:101:1::1", False), ("2002:0a00:0001:ffff::", False), ("2002:808:808::1", True),
    # Teredo: server bits 32-64, client the last 32 bits inverted; 2001::/32 itself is not globally reachable
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # client 192.0.2.45 (documentation)
    ("2001:0:808:808::80ff:fffe", False),  # client 127.0.0.1
    ("2001:0:a00:1::f7f7:fbfb", False),  # server 10.0.0.1
    ("2001:0:808:808::f7f7:fbfb", False),  # both public: still refused, as 2001::/32
    # plain IPv6 for comparison
    ("2001:4860:4860::8888", True), ("fd00::7f00:1", False), ("fe80::7f00:1", False),
]


@pytest.mark.parametrize(("address", "allowed"), EMBEDDED)
def test_ipv6_forms_embedding_ipv4_are_judged_by_the_embedded_address(address: str, allowed: bool) -> None:
    url = f"http://[{address}]:8080/hook"
    if allowed:
        assert check_url(url, OPEN) == url
    else:
        with pytest.raises(CallbackRefused, match="not a public address"):
            check_url(url, OPEN)
    assert OPEN.allows(ipaddress.ip_address(address)) is allowed


@pytest.mark.parametrize(("address", "allowed"), [
    ("64:ff9b::10.9.1.1", True), ("::10.9.1.1", True), ("::ffff:0:10.9.1.1", True), ("2002:a09:101::1", True),
    ("64:ff9b::10.8.1.1", False), ("2002:a08:101::1", False), ("64:ff9b:1::a09:101", False),
])  # fmt: skip
def test_an_allowed_network_opens_the_embedded_spellings_of_its_addresses(address: str, allowed: bool) -> None:
    policy = CallbackPolicy(allowed_nets=CallbackPolicy.parse_nets("10.9.0.0/16"))
    assert policy.allows(ipaddress.ip_address(address)) is allowed
    local_use = CallbackPolicy(allowed_nets=CallbackPolicy.parse_nets("64:ff9b:1::/48"))
    assert local_use.allows(ipaddress.ip_address("64:ff9b:1::a09:101"))  # the operator named the prefix


def test_a_name_resolving_to_an_embedded_form_is_judged_by_the_embedded_address(tmp_path: Path) -> None:
    """Names resolved by the check (getaddrinfo) through a private /etc/hosts: bwrap binds one over the host's
    for a child process only, so no DNS server and no change to this machine's files."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bwrap is not installed")
    hosts = tmp_path / "hosts"
    hosts.write_text("64:ff9b::7f00:1 nat64-loopback.test\n2002:a9fe:a9fe::1 sixtofour-metadata.test\n"
                     "::ffff:0:a00:1 translated-private.test\n64:ff9b::808:808 nat64-public.test\n")
    script = (
        "from sless_api.services.asynccalls.callback import CallbackPolicy, CallbackRefused, check_url\n"
        "for name in ('nat64-loopback.test', 'sixtofour-metadata.test', 'translated-private.test',"
        " 'nat64-public.test'):\n"
        "    try:\n"
        "        check_url(f'http://{name}/hook', CallbackPolicy())\n"
        "        print(name, 'allowed')\n"
        "    except CallbackRefused as exc:\n"
        "        print(name, 'refused', exc)\n"
    )
    argv = [bwrap, "--dev-bind", "/", "/", "--ro-bind", str(hosts), "/etc/hosts", "--", sys.executable, "-c", script]
    if os.geteuid() != 0:
        argv[1:1] = ["--unshare-user"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr[-2000:]
    verdicts = {line.split()[0]: line.split()[1] for line in run.stdout.splitlines()}
    assert verdicts == {"nat64-loopback.test": "refused", "sixtofour-metadata.test": "refused",
                        "translated-private.test": "refused", "nat64-public.test": "allowed"}, run.stdout
    assert "64:ff9b::7f00:1" in run.stdout  # the refusal names the address the name resolved to
