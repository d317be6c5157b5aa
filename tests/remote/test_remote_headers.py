"""Extra gRPC metadata (BuildBuddy's API key, say) reaches the server on every call."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from rsi.errors import UsageError
from rsi.remote._proto.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from rsi.remote._proto.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from rsi.remote.client import HEADERS_ENV, RemoteClient, remote_headers

pytestmark = pytest.mark.e2e


class _Capabilities(re_grpc.CapabilitiesServicer):
    """A real gRPC server on loopback that answers Capabilities and records the metadata."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def GetCapabilities(self, request, context):  # noqa: N802 - the REAPI method name
        self.seen.append(dict(context.invocation_metadata()))
        caps = re_pb2.ServerCapabilities()
        caps.cache_capabilities.digest_functions.append(re_pb2.DigestFunction.SHA256)
        caps.cache_capabilities.max_batch_total_size_bytes = 1 << 20
        return caps


@pytest.fixture
def capabilities_server():
    servicer = _Capabilities()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    re_grpc.add_CapabilitiesServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"grpc://127.0.0.1:{port}", servicer
    server.stop(0)


def test_configured_headers_are_sent_on_every_call(capabilities_server, monkeypatch):
    url, servicer = capabilities_server
    monkeypatch.setenv(HEADERS_ENV, "X-BuildBuddy-API-Key=secret, x-extra = 1")
    with RemoteClient(url) as client:
        assert client.capabilities().digest_functions == ("sha256",)
    assert servicer.seen[-1]["x-buildbuddy-api-key"] == "secret"
    assert servicer.seen[-1]["x-extra"] == "1"


def test_no_headers_configured_sends_none(capabilities_server, monkeypatch):
    url, servicer = capabilities_server
    monkeypatch.delenv(HEADERS_ENV, raising=False)
    with RemoteClient(url) as client:
        client.capabilities()
    assert "x-buildbuddy-api-key" not in servicer.seen[-1]


def test_a_malformed_header_setting_is_a_usage_error_naming_the_variable():
    with pytest.raises(UsageError, match=HEADERS_ENV):
        remote_headers("x-buildbuddy-api-key")
