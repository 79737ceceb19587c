"""The Clusters side panel behind a real JupyterHub, driven in Debian's Chromium.

alice logs in through the hub's login form, the hub spawns her single-user JupyterLab, and
the panel's cluster requests go to her server, which delegates them to the hub's cloudtik
sidekick.  The cluster she starts from the New form therefore belongs to the sidekick (owner
alice), runs with the catalogue provider an admin defined for her group, and is invisible
to bob.  The provider's secret must never reach her page.  Her side-kicks (services an
admin defined in the catalogue) are started, opened and stopped from the panel's Side-kicks
section, which only hub users see.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import pytest
import requests

from cloudtik_emulators.browser import confirm
from cloudtik_emulators.hub import PASSWORD, Hub, start_hub
from cloudtik_emulators.processes import (
    cloudtik_processes,
    describe,
    kill_all,
    stop_launcher,
)

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PROVIDER = "local-pool"
OTHER = "local-spare"
SECRET = "pool-secret-" + secrets.token_hex(8)  # a value that must never be on the page
SIDEKICK = "jobgw"
SIDEKICK_ENTRY = {"spec": {"entry_point": "jupyter_cloudtik.hub.job_gateway",
                           "health_interval": 0.5},
                  "groups": ["physics"], "description": "HTTP to HPC jobs"}


def _clusters(hub: Hub, user: str) -> list[dict]:
    r = hub.session(user).get(hub.sidekick_api + "clusters", timeout=30)
    r.raise_for_status()
    return r.json()["clusters"]


def _down_all(hub: Hub) -> list[str]:
    """Stop every cluster the sidekick still runs (as admin, who sees them all)."""
    problems = []
    admin = hub.session("admin")
    try:
        rows = admin.get(hub.sidekick_api + "clusters", timeout=30).json()["clusters"]
    except (requests.RequestException, ValueError, KeyError) as e:
        return [f"listing clusters failed: {e}"]
    for c in rows:
        if c.get("state") == "stopped":
            continue
        r = admin.delete(hub.sidekick_api + f"clusters/{c['name']}", timeout=60)
        if r.status_code != 202:
            problems.append(f"down {c['name']}: {r.status_code} {r.text[:200]}")
            continue
        op_id = r.json()["operation"]["id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            op = admin.get(hub.sidekick_api + f"operations/{op_id}", timeout=30).json()
            if op["state"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.3)
    return problems


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Iterator[Hub]:
    base = tmp_path_factory.mktemp("hub-browser")
    hub = start_hub(base)
    problems: list[str] = []
    try:
        r = hub.browser("admin").put(
            hub.sidekick_api + f"hub/catalog/provider/{PROVIDER}", timeout=30,
            json={"spec": {"type": "local"}, "secrets": {"token": SECRET},
                  "groups": ["physics"]})
        assert r.status_code in (200, 201), r.text
        # a second choice, so that the form's choice has to reach the sidekick
        r = hub.browser("admin").put(
            hub.sidekick_api + f"hub/catalog/provider/{OTHER}", timeout=30,
            json={"spec": {"type": "local"}, "groups": ["physics"]})
        assert r.status_code in (200, 201), r.text
        yield hub
    finally:
        problems += _down_all(hub)
        for user in ("alice", "bob"):
            hub.stop_server(user)
        hub.stop()
        stop_launcher(hub.state_dir)
        left = cloudtik_processes(base)
        if left:
            problems.append(f"processes left behind:\n{describe(left)}")
            kill_all(left)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "hub-browser.log").write_text(hub.log_tail(400))
    assert not problems, problems


def _login(page, hub: Hub, user: str) -> None:
    """Log in through the hub's form and open the panel of the user's JupyterLab."""
    page.goto(f"{hub.url}hub/login", timeout=30_000)
    page.fill("input[name='username']", user)
    page.fill("input[name='password']", PASSWORD)
    page.click("input[type='submit'], button[type='submit']")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=90_000)
    tab = page.locator("li[data-id='jupyter-cloudtik-panel']")
    tab.wait_for(timeout=90_000)
    # a second login restores the last layout, where the panel may be open already: the
    # tab toggles it, so click only while it is not shown
    panel = page.locator(".jp-CloudTik-panel")
    for _ in range(5):
        if panel.is_visible():
            break
        tab.click()
        try:
            panel.wait_for(state="visible", timeout=2_000)
        except Exception:  # a layout restore may have closed it again: look again
            continue
    page.wait_for_selector(".jp-CloudTik-panel .jp-CloudTik-live.jp-mod-live",
                           timeout=30_000)


@pytest.mark.slow
def test_alice_starts_and_stops_a_cluster_through_the_hub(hub, browser):
    name = "br1"
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    seen: list[str] = []  # every API answer the page got, to look for the secret

    def on_response(resp) -> None:
        if "/cloudtik/api/" in resp.url:
            try:
                seen.append(resp.url + " " + resp.text())
            except Exception:  # streams and redirects have no body to read
                seen.append(resp.url)

    page.on("response", on_response)
    try:
        _login(page, hub, "alice")

        page.click(".jp-CloudTik-new")
        page.wait_for_selector(".jp-CloudTik-form", timeout=15_000)
        form = page.locator(".jp-CloudTik-form")
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(".jp-CloudTik-panel").screenshot(path=str(ARTIFACTS / "hub-form.png"))
        select = form.locator("select[name='provider']")
        assert select.count() == 1, (
            "the New form offers no provider select; it shows: "
            f"{form.inner_text()!r}; the sidekick's providers answer: "
            f"{json.dumps(_providers(hub, 'alice'))}")
        offered = select.locator("option").evaluate_all("os => os.map(o => o.value)")
        assert sorted(offered) == [PROVIDER, OTHER], offered
        select.select_option(PROVIDER)
        # a catalogue entry brings the admin's provider settings: the form has none to offer
        form.locator(".jp-CloudTik-providerDescription").wait_for(timeout=5_000)
        assert form.locator("[name^='provider.']").count() == 0, form.inner_text()
        form.locator("input[name='name']").fill(name)
        form.locator("input[name='workers']").fill("1")
        form.locator(".jp-CloudTik-start").click()

        item = page.locator(f".jp-CloudTik-cluster[data-name='{name}']")
        running = f".jp-CloudTik-cluster[data-name='{name}'] " \
            ".jp-CloudTik-badge[data-state='running']"
        page.wait_for_selector(f"{running}, .jp-CloudTik-formError", timeout=90_000)
        error = page.locator(".jp-CloudTik-formError")
        assert not error.count(), f"starting {name} with {PROVIDER}: {error.inner_text()!r}"
        item.locator(".jp-CloudTik-badge[data-state='running']").wait_for(timeout=90_000)
        assert _audit_provider(hub, name) == PROVIDER
        page.locator(".jp-CloudTik-panel").screenshot(path=str(ARTIFACTS / "hub-panel.png"))

        # the sidekick owns it, for alice; bob does not see it
        mine = {c["name"]: c for c in _clusters(hub, "alice")}
        assert name in mine and mine[name]["state"] == "running", mine
        assert mine[name].get("owner") == "alice", mine[name]
        assert name not in [c["name"] for c in _clusters(hub, "bob")]

        confirm(page, item.locator(".jp-CloudTik-shutdown"), name)
        item.wait_for(state="detached", timeout=60_000)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = {c["name"]: c["state"] for c in _clusters(hub, "alice")}
            if states.get(name, "stopped") == "stopped":
                break
            time.sleep(0.3)
        assert states.get(name, "stopped") == "stopped", states

        assert SECRET not in page.content()
        leaked = [s.split(" ", 1)[0] for s in seen if SECRET in s]
        assert not leaked, f"the provider secret reached the page from: {leaked}"
        # the page spoke only to alice's own server, which delegated to the sidekick
        assert any("/user/alice/cloudtik/api/clusters" in s for s in seen), seen[:5]
        assert not [s for s in seen if "/services/cloudtik/" in s.split(" ", 1)[0]]
    finally:
        page.screenshot(path=str(ARTIFACTS / "hub-last.png"))
        context.close()


def _providers(hub: Hub, user: str) -> object:
    r = hub.session(user).get(hub.sidekick_api + "providers", timeout=30)
    return r.json() if r.ok else {"status": r.status_code, "body": r.text[:300]}


def _audit_provider(hub: Hub, cluster: str) -> str | None:
    """The catalogue provider the sidekick recorded for starting ``cluster``."""
    r = hub.session("admin").get(hub.sidekick_api + "hub/audit", timeout=30)
    r.raise_for_status()
    for entry in r.json()["entries"]:
        if entry["action"] == "cluster.up" and entry["target"] == cluster:
            return entry["detail"].get("provider")
    return None


def _sidekick(hub: Hub, user: str, name: str) -> dict:
    r = hub.session(user).get(hub.sidekick_api + "hub/sidekicks", timeout=30)
    r.raise_for_status()
    rows = {s["name"]: s for s in r.json()["sidekicks"]}
    assert name in rows, rows
    return rows[name]


@pytest.mark.slow
def test_alice_starts_opens_and_stops_a_sidekick_from_the_panel(hub, browser):
    r = hub.browser("admin").put(hub.sidekick_api + f"hub/catalog/sidekick/{SIDEKICK}",
                                 json=SIDEKICK_ENTRY, timeout=30)
    assert r.status_code in (200, 201), r.text
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    item_sel = f".jp-CloudTik-sidekick[data-name='{SIDEKICK}']"
    try:
        _login(page, hub, "alice")
        section = page.locator(".jp-CloudTik-section[data-section='sidekicks']")
        section.wait_for(timeout=30_000)
        item = page.locator(item_sel)
        item.wait_for(timeout=15_000)
        assert "HTTP to HPC jobs" in item.inner_text()
        assert item.get_attribute("data-state") == "stopped"
        assert not item.locator(".jp-CloudTik-sidekickOpen").count()

        item.locator(".jp-CloudTik-sidekickStart").click()
        page.wait_for_selector(
            f"{item_sel}[data-state='running'] .jp-CloudTik-sidekickOpen, "
            ".jp-CloudTik-sidekicks .jp-CloudTik-error", timeout=60_000)
        error = page.locator(".jp-CloudTik-sidekicks .jp-CloudTik-error")
        assert not error.count(), f"starting {SIDEKICK}: {error.inner_text()!r}"
        row = _sidekick(hub, "alice", SIDEKICK)
        assert row["state"] == "running", row
        url = row["instance"]["url"]
        assert url == f"/services/cloudtik/sidekicks/alice/{SIDEKICK}/", url
        link = item.locator(".jp-CloudTik-sidekickOpen")
        assert link.get_attribute("href") == url
        assert link.get_attribute("target") == "_blank"
        assert "0 restarts" in item.locator(".jp-CloudTik-restarts").inner_text()
        # health checks every 0.5 s; the panel re-reads the list every few seconds
        item.locator(".jp-CloudTik-health.jp-mod-ok").wait_for(timeout=15_000)
        assert "healthy" in item.locator(".jp-CloudTik-health").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(".jp-CloudTik-panel").screenshot(path=str(ARTIFACTS / "hub-sidekick.png"))

        # the link opens a new tab at the side-kick, on the same origin (the hub's proxy)
        with page.expect_popup(timeout=30_000) as popup_info:
            link.click()
        popup = popup_info.value
        popup.wait_for_load_state(timeout=30_000)
        assert popup.url.startswith(urljoin(hub.url, url)), popup.url
        # the tab logged in to the sidekick through the hub (OAuth) and reached the service
        r = popup.goto(urljoin(hub.url, url + "health"))
        assert r.status == 200 and r.json()["user"] == "alice", r.text()
        popup.close()

        item.locator(".jp-CloudTik-sidekickStop").click()
        page.wait_for_selector(f"{item_sel}[data-state='stopped']", timeout=30_000)
        assert not item.locator(".jp-CloudTik-sidekickOpen").count()
        assert not page.locator(".jp-CloudTik-sidekicks .jp-CloudTik-error").count()
        assert _sidekick(hub, "alice", SIDEKICK)["state"] == "stopped"
    finally:
        page.screenshot(path=str(ARTIFACTS / "hub-sidekick-last.png"))
        context.close()
        s = hub.session("alice")
        row = s.get(hub.sidekick_api + "hub/sidekicks", timeout=30).json()
        if any(x["name"] == SIDEKICK and x["state"] != "stopped"
               for x in row.get("sidekicks", [])):
            s.delete(hub.sidekick_api + f"hub/sidekicks/{SIDEKICK}", timeout=60)


@pytest.mark.slow
def test_egress_rules_and_offers_are_answered_on_the_users_own_page(hub, browser):
    """What no token may do (issue 26) is done on the sidekick's page, in the person's
    own browser: alice adds a rule offered to bob; bob accepts it with its button.  The
    value never comes back to either page, and the offer stays bob's to answer."""
    value = "Bearer page-" + secrets.token_hex(8)
    contexts = []
    try:
        pages = {}
        for user in ("alice", "bob"):
            context = browser.new_context()
            contexts.append(context)
            page = context.new_page()
            page.goto(f"{hub.url}hub/login?next=/services/cloudtik/egress", timeout=30_000)
            page.fill("input[name='username']", user)
            page.fill("input[name='password']", PASSWORD)
            page.click("input[type='submit'], button[type='submit']")
            page.wait_for_selector(f"#who:has-text('{user}')", timeout=60_000)
            pages[user] = page
        a = pages["alice"]
        a.fill("#put input[name='id']", "page-rule")
        a.fill("#put input[name='host']", "data.example.org")
        a.fill("#put input[name='value']", value)
        a.fill("#put input[name='users']", "bob")
        a.click("#put button")
        a.wait_for_selector("#put-msg.ok", timeout=30_000)
        a.wait_for_selector("#own tbody tr:has-text('page-rule')", timeout=30_000)
        assert "bob (offered)" in a.locator("#own tbody tr").first.inner_text()
        b = pages["bob"]
        b.reload()
        row = b.locator("#offers tbody tr:has-text('page-rule')")
        row.wait_for(timeout=30_000)
        assert "offered" in row.inner_text()
        row.locator("button:has-text('Accept')").click()
        b.wait_for_selector("#offers tbody tr:has-text('accepted')", timeout=30_000)
        b.wait_for_selector("#applied:has-text('user/alice/page-rule')", timeout=30_000)
        for page in (a, b):
            assert value not in page.content()
        # the same answer with bob's token is refused: consent is his browser's
        r = hub.session("bob").post(hub.sidekick_api + "hub/egress/shares/page-rule/decline")
        assert r.status_code == 403 and r.json()["field"] == "token", r.text
    finally:
        for context in contexts:
            context.close()
        hub.browser("alice").delete(hub.sidekick_api + "hub/egress/rules/page-rule")
