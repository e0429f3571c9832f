"""``python -m devservers.cosmos_setup`` fails in one line that names the endpoint and what to change."""

from __future__ import annotations

import socket

import pytest

from devservers import cosmos_setup
from tests.devservers.helptext import options_without_help
from tests.devservers.tlsserver import tls_server
from tests.support.cosmos import CosmosEndpoint


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_a_server_that_is_not_running_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    assert cosmos_setup.main(["--endpoint", endpoint]) == 1
    err = one_line_error(capsys)
    assert f"Cosmos DB at {endpoint}: connection refused" in err and "python -m devservers.cosmos" in err


def test_https_to_the_plain_http_server_says_use_http(cosmos_endpoint: CosmosEndpoint,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    if not cosmos_endpoint.local:
        pytest.skip("the local server speaks plain HTTP; another endpoint may not")
    https = cosmos_endpoint.url.replace("http://", "https://")
    assert cosmos_setup.main(["--endpoint", https, "--no-verify-tls"]) == 1
    err = one_line_error(capsys)
    assert "the server does not speak TLS" in err and f"use {cosmos_endpoint.url}" in err


def test_a_key_that_is_not_base64_is_named(cosmos_endpoint: CosmosEndpoint, capsys: pytest.CaptureFixture[str]) -> None:
    assert cosmos_setup.main(["--endpoint", cosmos_endpoint.url, "--key", "not-a-key!"]) == 1
    assert "the account key (--key) is not valid base64" in one_line_error(capsys)


def test_an_endpoint_that_is_not_a_url_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cosmos_setup.main(["--endpoint", "127.0.0.1:8081"])
    assert caught.value.code == 2
    assert "not an http:// or https:// URL" in capsys.readouterr().err


def test_every_option_has_help_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cosmos_setup.main(["--help"])
    text = capsys.readouterr().out
    assert "examples:\n  python -m devservers.cosmos_setup --endpoint" in text and "exit status: 0" in text
    assert options_without_help(text) == []


def test_http_to_a_tls_server_says_use_https(capsys: pytest.CaptureFixture[str]) -> None:
    with tls_server() as port:
        assert cosmos_setup.main(["--endpoint", f"http://127.0.0.1:{port}"]) == 1
    err = one_line_error(capsys)
    assert "the server closed the connection" in err and f"use https://127.0.0.1:{port} with --no-verify-tls" in err


def test_an_untrusted_certificate_says_no_verify_tls(capsys: pytest.CaptureFixture[str]) -> None:
    # Not 127.0.0.1 or localhost: for those azure-cosmos never verifies certificates (the emulator's).
    with tls_server("127.0.0.2") as port:
        assert cosmos_setup.main(["--endpoint", f"https://127.0.0.2:{port}"]) == 1
    err = one_line_error(capsys)
    assert "certificate is not trusted" in err and "pass --no-verify-tls" in err
