"""The four ways the security tests knock on a Prefect API served over HTTPS, and where a key may not be.

:func:`probe` asks ``POST /flow_runs/filter`` as plain HTTP, as HTTPS trusting only the system's
authorities, as HTTPS with the server's certificate but no credential, and with both. Run as
``python -m tests.helpers.https_api CLIENT_FILE`` it probes with that client file and prints the
outcome as JSON (how a process in another network namespace probes the API).
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
import urllib.error
import urllib.request


def _ask(url: str, auth_string: str | None, context: ssl.SSLContext | None) -> int | str:
    request = urllib.request.Request(
        f"{url}/flow_runs/filter", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    if auth_string:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            return "certificate verify failed"
        return f"no HTTP answer: {type(reason).__name__}"


def probe(api_url: str, auth_string: str | None, cafile: str) -> dict[str, int | str]:
    """Outcomes by name: an int is an HTTP status, a string says why there was none."""
    assert api_url.startswith("https://"), api_url
    return {
        "plain_http": _ask("http://" + api_url[len("https://") :], auth_string, None),
        "https_without_certificate": _ask(api_url, auth_string, ssl.create_default_context()),
        "https_without_credential": _ask(api_url, None, ssl.create_default_context(cafile=cafile)),
        "https_with_both": _ask(api_url, auth_string, ssl.create_default_context(cafile=cafile)),
    }


def assert_only_both_get_in(outcome: dict) -> None:
    assert str(outcome["plain_http"]).startswith("no HTTP answer"), outcome
    assert outcome["https_without_certificate"] == "certificate verify failed", outcome
    assert outcome["https_without_credential"] == 401, outcome
    assert outcome["https_with_both"] == 200, outcome


def key_lines(key_file) -> list[str]:
    """The base64 lines of a PEM private key's body: any one of them found somewhere is a leak."""
    from pathlib import Path

    lines = Path(key_file).read_text().splitlines()
    body = [line for line in lines if line and not line.startswith("-----")]
    assert body and all(len(line) >= 40 for line in body[:-1]), "not a PEM key"
    return [line for line in body if len(line) >= 16]


if __name__ == "__main__":
    from espnet3_prefect.disk.client_file import read_client_file

    creds = read_client_file(sys.argv[1])
    print(json.dumps(probe(creds.api_url, creds.auth_string, creds.ssl_cert_file)))
