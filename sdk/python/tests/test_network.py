"""Networking through the Python SDK against a real server: the policy on
create and set_network, typed errors for bad entries, the egress log, and
get_url through the port proxy. No traffic leaves the machine: blocked
names are answered by the sandbox's own resolver."""

from __future__ import annotations

import time

import httpx
import pytest

from pandastack import InvalidRequestError, NetworkDeniedError, Sandbox


def test_policy_on_create_and_live_change(server):
    sb = Sandbox.create(ttl_seconds=120, network={"allow_internet_access": False, "allow_out": ["api.allowed.test"]})
    try:
        assert sb.network == {"allow_internet_access": False, "allow_out": ["api.allowed.test"], "deny_out": []}
        sb.set_network(allow_internet_access=True, deny_out=["203.0.113.0/24"])
        assert sb.network is not None and sb.network["deny_out"] == ["203.0.113.0/24"]
        with pytest.raises(InvalidRequestError, match=r"allow_out\[1\]"):
            sb.set_network(allow_out=["1.2.3.4", "not a domain"])
        with pytest.raises(NetworkDeniedError, match=r"allow_out\[0\]"):
            sb.set_network(allow_out=["169.254.169.254"])
        assert sb.refresh().network["deny_out"] == ["203.0.113.0/24"]  # nothing half-applied
        # Without allow_internet_access only allow_out is reachable, as in
        # the API; the policy may be one mapping, as create takes it.
        sb.set_network(allow_out=["api.allowed.test"])
        assert sb.network == {"allow_internet_access": False, "allow_out": ["api.allowed.test"], "deny_out": []}
        sb.set_network({"allow_internet_access": True, "deny_out": ["198.51.100.0/24"]})
        assert sb.network == {"allow_internet_access": True, "allow_out": [], "deny_out": ["198.51.100.0/24"]}
        with pytest.raises(TypeError):
            sb.set_network({"allow_out": ["a.test"]}, allow_out=["b.test"])
        with pytest.raises(TypeError):
            sb.set_network(allow_out="api.allowed.test")
        assert sb.refresh().network["deny_out"] == ["198.51.100.0/24"]
    finally:
        sb.kill()


def test_allowlist_alone_is_no_internet(server):
    sb = Sandbox.create(ttl_seconds=120, network={"allow_out": ["api.allowed.test"]})
    try:
        assert sb.network == {"allow_internet_access": False, "allow_out": ["api.allowed.test"], "deny_out": []}
    finally:
        sb.kill()


def test_network_log_records_blocked_names(server):
    sb = Sandbox.create(ttl_seconds=120, network={"allow_internet_access": False, "allow_out": ["api.allowed.test"]})
    try:
        r = sb.exec(["python3", "-c", "import socket\ntry:\n socket.gethostbyname('blocked.example')\nexcept socket.gaierror:\n print('nxdomain')"])
        assert r.stdout.strip() == "nxdomain"
        entries = sb.network_log()
        assert any(e["kind"] == "dns" and e["domain"] == "blocked.example" and not e["allowed"] for e in entries), entries
    finally:
        sb.kill()


def test_get_url(server):
    sb = Sandbox.create(ttl_seconds=120)
    try:
        sb.exec("cd /tmp && echo from-the-sandbox > hi.txt && nohup python3 -m http.server 8000 >/dev/null 2>&1 &")
        url = sb.get_url(8000)
        assert "/ports/8000/" in url and "pandastack_token=" in url
        deadline = time.monotonic() + 20
        while True:
            r = httpx.get(url.replace("/ports/8000/", "/ports/8000/hi.txt"))  # no API key: the token does it
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "from-the-sandbox\n"
        plain = sb.get_url(8000, token=False)
        assert httpx.get(plain + "hi.txt").status_code == 401
        r = httpx.get(plain + "hi.txt", headers={"Authorization": "Bearer " + server.api_key})
        assert r.text == "from-the-sandbox\n"
        assert httpx.get(plain.replace("/8000/", "/8001/"), headers={"Authorization": "Bearer " + server.api_key}).status_code == 502
    finally:
        sb.kill()


def test_fork_with_a_policy_of_its_own(server):
    sb = Sandbox.create(ttl_seconds=120, network={"allow_internet_access": True})
    try:
        kids = sb.fork(1, ttl_seconds=60, network={"allow_out": ["api.allowed.test"]})
        try:
            assert kids[0].network == {"allow_internet_access": False, "allow_out": ["api.allowed.test"], "deny_out": []}
            assert sb.refresh().network["allow_internet_access"] is True
        finally:
            kids[0].kill()
        with pytest.raises(NetworkDeniedError, match=r"allow_out\[0\]"):
            sb.fork(1, network={"allow_out": ["169.254.169.254"]})
    finally:
        sb.kill()
