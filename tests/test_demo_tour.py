"""The demo as the README's Quickstart starts it (scripts/demo.sh's gunicorn command):
the fourth round's capabilities on the embedded defaults (memory storage, SQLite).
Its sheddable endpoint answers 503 under a burst while its critical one is served, a
client's usage page counts its calls, a network rule refuses 127.0.0.2, a signed webhook
reaches the demo's own receiver, and a prepaid client spends its credits balance down to
a 402 that `flask quota credits show` agrees with."""

from __future__ import annotations

import base64
import http.client
import http.cookiejar
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.demo import flask_quota
from tests.servers import ROOT, free_port, wait_for_port

pytestmark = pytest.mark.slow

PASSWORD = "demo-tour-test"
SECRET = "demo-tour-webhook-secret-0123456789"


def quickstart_command(port: int) -> list[str]:
    """The gunicorn command scripts/demo.sh ends with, for ``port``: this test starts the
    demo exactly as the Quickstart does, minus the venv set-up before it."""
    script = (ROOT / "scripts" / "demo.sh").read_text("utf-8")
    (line,) = [x for x in script.splitlines() if x.startswith("exec ")]
    words = shlex.split(line.replace("${PORT}", str(port)).replace("${PORT:-8000}", str(port)))
    assert words[1].endswith("gunicorn") and words[-1] == "wsgi:app", words
    assert 'export PORT="${PORT:-8000}"' in script  # the demo's webhooks need the port
    return [sys.executable, "-m", "gunicorn", *words[2:]]


@dataclass
class Demo:
    port: int
    log: Path
    database: str  # its QUOTA_DATABASE_URL, for `flask --app wsgi quota ...`

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def call(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        source: str | None = None,
        body: bytes | None = None,
    ) -> tuple[int, bytes]:
        status, _, content = self.exchange(method, path, headers, source, body)
        return status, content

    def exchange(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        source: str | None = None,
        body: bytes | None = None,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One request on a fresh connection: its status, headers and body."""
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=30, source_address=(source, 0) if source else None
        )
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.headers, response.read()
        finally:
            conn.close()

    def until(self, what: str, probe: Any, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = probe()
            if found:
                return found
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{self.text()}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    folder = tmp_path_factory.mktemp("demo-tour")
    port = free_port()
    log = folder / "demo.log"
    database = f"sqlite:///{folder / 'quota.sqlite3'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_")}
    env.update(
        PORT=str(port),
        PYTHONPATH=str(ROOT),
        QUOTA_DATABASE_URL=database,
        SECRET_KEY="demo-tour-test",
        DEMO_DASHBOARD_PASSWORD=PASSWORD,
        QUOTA_WEBHOOK_SECRET=SECRET,
    )
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            quickstart_command(port), cwd=ROOT, env=env, stdout=out, stderr=out,
            start_new_session=True,
        )  # fmt: skip
    server = Demo(port, log, database)
    try:
        wait_for_port(port, timeout=30)
        server.until("the tour", lambda: "flask-quota demo tour:" in server.text(), 60)
        yield server
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=15)


def test_the_demo_prints_a_tour_of_curl_lines(demo: Demo) -> None:
    """At start the demo prints a short tour: a few ``curl`` lines on its own port,
    naming the sheddable endpoint, the network rule, the usage page, the receiver, and
    the prepaid client's spending and its page on the dashboard (its balance)."""
    text = demo.text()
    tour = text.split("flask-quota demo tour:", 1)[1]
    lines = [line.strip() for line in tour.splitlines() if line.startswith("  ")]
    assert 5 <= len(lines) <= 10, lines
    assert sum(line.startswith(("curl", "for i")) for line in lines) >= 4, lines
    assert all(demo.base in line for line in lines), lines
    payg, _ = _key(demo, "payg")
    for part in (
        "/v1/reports", "--interface 127.0.0.2", "/quota/usage/client/", "/demo/webhooks",
        '"X-API-Key: $PAYG_KEY"', "/v1/sms", "X-Credits-Balance", f"/quota/identity/id={payg} ",
    ):  # fmt: skip
        assert any(part in line for line in lines), (part, lines)
    assert "Traceback" not in text, text


def test_a_burst_sheds_the_sheddable_endpoint_and_serves_the_critical_one(demo: Demo) -> None:
    """Twelve slow reports at once (sheddable; the demo's capacity is 8 in flight, of
    which sheddable requests may use 5): some are shed with 503 and a problem body naming
    the capacity, some served; a checkout (critical) sent in the burst is served."""
    with ThreadPoolExecutor(max_workers=13) as pool:
        burst = [pool.submit(demo.call, "GET", "/v1/reports") for _ in range(12)]
        time.sleep(0.3)  # the reports hold their slots for a second
        checkout = demo.call("POST", "/v1/checkout")
        answers = [future.result() for future in burst]
    statuses = sorted(status for status, _ in answers)
    assert 200 in statuses and 503 in statuses, statuses
    assert set(statuses) == {200, 503}, statuses
    shed = json.loads(next(body for status, body in answers if status == 503))
    assert (shed["tier"], shed["priority"], shed["status"]) == ("capacity", "sheddable", 503)
    assert checkout[0] == 200, checkout


def test_a_network_rule_refuses_127_0_0_2(demo: Demo) -> None:
    """The demo's network rule, made at its first start: a request from 127.0.0.2 gets
    403 naming the network tier; from 127.0.0.1 the same request is served."""

    def refused() -> bytes | None:
        status, body = demo.call("GET", "/v1/items", source="127.0.0.2")
        return body if status == 403 else None

    body = demo.until("the network rule", refused)
    assert json.loads(body)["tier"] == "network"
    assert demo.call("GET", "/v1/items")[0] == 200


def _key(demo: Demo, plan: str) -> tuple[str, str]:
    """The id and API key of ``plan``'s demo client, as the demo printed them."""
    found = re.search(rf"^\s+{plan}\s+client (\d+)\s+(\S+)$", demo.text(), re.M)
    assert found is not None, demo.text()
    return found.group(1), found.group(2)


def _operator() -> tuple[urllib.request.OpenerDirector, dict[str, str]]:
    """A browser-like client of the dashboard: its cookie, and the login header."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
    )
    token = base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    return opener, {"Authorization": f"Basic {token}"}


def test_a_clients_usage_page_counts_its_calls(demo: Demo) -> None:
    """With the ledger on, three searches with the free client's key show on its usage
    page on the dashboard (bulk_search: 3 units, 3 requests)."""
    client, key = _key(demo, "free")
    for _ in range(3):
        assert demo.call("GET", "/v1/search?q=x", headers={"X-API-Key": key})[0] == 200
    opener, login = _operator()

    def totals() -> str | None:
        request = urllib.request.Request(f"{demo.base}/quota/usage/client/{client}", headers=login)
        with opener.open(request, timeout=10) as response:
            page = response.read().decode()
        table = re.search(r'<table id="usage-totals">(.*?)</table>', page, re.S)
        assert table is not None and 'id="ledger-off"' not in page, page[:2000]
        row = re.search(r'<tr data-resource="bulk_search">(.*?)</tr>', table.group(1), re.S)
        if row is None:
            return None
        cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
        return row.group(1) if cells[:3] == ["bulk_search", "3", "3"] else None

    demo.until("the usage page's totals", totals)


def test_a_signed_webhook_reaches_the_demos_receiver(demo: Demo) -> None:
    """An operator blocks a caller on the dashboard; its ``caller.blocked`` event is
    delivered, signed, to the demo's receiver, which shows it; a delivery with a wrong
    signature is refused (400) and not shown."""
    opener, login = _operator()
    with opener.open(urllib.request.Request(f"{demo.base}/quota/blocks", headers=login)) as r:
        token = re.search(r'name="csrf_token" value="([^"]+)"', r.read().decode())
    assert token is not None
    form = {"caller": "webhook-probe", "duration": "10m", "csrf_token": token.group(1)}
    request = urllib.request.Request(
        f"{demo.base}/quota/blocks/new", data=urllib.parse.urlencode(form).encode(),
        headers=login, method="POST",
    )  # fmt: skip
    with opener.open(request, timeout=10) as response:
        assert response.status == 200 and response.url.endswith("/quota/blocks")
    forged = json.dumps({"id": "evt_forged", "type": "caller.blocked", "data": {}}).encode()
    status, _ = demo.call(
        "POST", "/demo/webhooks", body=forged,
        headers={"Content-Type": "application/json", "Quota-Signature": "t=1,v1=00"},
    )  # fmt: skip
    assert status == 400

    def received() -> list[dict[str, Any]]:
        body = json.loads(demo.call("GET", "/demo/webhooks?format=json")[1])
        return [e for e in body["events"] if e["type"] == "caller.blocked"]

    (event,) = demo.until("the caller.blocked webhook", received, 60)
    assert event["data"]["caller"] == "id=webhook-probe" and event["id"].startswith("evt_")
    page = demo.call("GET", "/demo/webhooks")[1].decode()
    assert "caller.blocked" in page and "evt_forged" not in page


def test_a_prepaid_client_spends_its_credits_down_to_a_402(demo: Demo) -> None:
    """The payg demo client, granted 100 credits at first start (and said so), sends SMS:
    one credit per 160 characters begun, ``X-Credits-Balance`` after each. Nine 10-credit
    messages after a 3-credit one leave 7: the next 10-credit one is refused with 402,
    the balance in its body and header, and a 1-credit one still goes. The free client,
    granted nothing, is refused its first. The client's page on the dashboard shows the
    balance, and ``flask --app wsgi quota credits show demo-payg`` the same (checkpointed
    within the sync interval) with the one grant."""
    assert "demo-payg (client " in demo.text() and "granted 100 prepaid sms" in demo.text()
    client, key = _key(demo, "payg")

    def sms(characters: int, sender: str = key) -> tuple[int, str | None, dict[str, Any]]:
        status, headers, body = demo.exchange(
            "POST", "/v1/sms", body=urllib.parse.urlencode({"text": "x" * characters}).encode(),
            headers={"X-API-Key": sender, "Content-Type": "application/x-www-form-urlencoded"},
        )  # fmt: skip
        return status, headers.get("X-Credits-Balance"), json.loads(body)

    status, balance, body = sms(400)
    assert (status, balance, body["segments"]) == (200, "97", 3), body
    assert [sms(1600)[:2] for _ in range(9)] == [(200, str(87 - 10 * i)) for i in range(9)]
    status, balance, body = sms(1600)
    assert (status, balance) == (402, "7"), body
    assert (body["tier"], body["resource"], body["plan"]) == ("credits", "sms", "payg"), body
    assert (body["balance"], body["cost"]) == (7, 10), body
    assert sms(160)[:2] == (200, "6")
    status, balance, body = sms(160, _key(demo, "free")[1])
    assert (status, balance, body["plan"], body["balance"]) == (402, "0", "free", 0), body
    opener, login = _operator()
    request = urllib.request.Request(f"{demo.base}/quota/identity/id={client}", headers=login)
    with opener.open(request, timeout=10) as response:
        page = response.read().decode()
    row = re.search(r'<tr data-resource="sms">(.*?)</tr>', page, re.S)
    assert row is not None, page[:3000]
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1)) == ["sms", "6", "segments"], row
    env = {
        "QUOTA_DATABASE_URL": demo.database,
        "PYTHONPATH": str(ROOT),
        "SECRET_KEY": "demo-tour-test",
        "DEMO_DASHBOARD_PASSWORD": PASSWORD,
    }

    def shown() -> str | None:
        text = flask_quota(env, "credits", "show", "demo-payg")
        return text if "sms: balance 6" in text else None

    text = demo.until("the balance in `credits show`", shown)
    assert re.search(r"^\d+\s+100\s+6\s+never\s+wsgi demo\s+demo: granted", text, re.M), text
