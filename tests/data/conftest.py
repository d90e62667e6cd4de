"""Fixtures of the data tests: a machine without network."""

import urllib.error
import urllib.request

import pytest


@pytest.fixture
def offline(monkeypatch):
    """Every URL fetch fails as it does without a network; records the URLs that were tried."""
    tried = []

    def refuse(request, *args, **kwargs):
        tried.append(request.full_url if isinstance(request, urllib.request.Request) else request)
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    return tried



@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """No data test may reach the network, whatever it calls."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in the data tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
