"""Adaptive scaling run by the Jupyter server: it follows the scheduler's own target with
the kernel that asked for it gone, grows to the maximum under a load of slow tasks and
shrinks to the minimum when idle, retiring workers so every result arrives."""

from __future__ import annotations

import time

import pytest

from .conftest import unique
from .kernels import running_kernel

pytestmark = pytest.mark.slow


def wait_for(lab, name: str, workers: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        info = lab.get(f"clusters/{name}").json()
        seen = (info["summary"]["wanted_workers"], info["state"])
        if seen == (workers, "running"):
            return
        time.sleep(0.5)
    raise AssertionError(f"cluster {name} did not reach {workers} workers: {seen}")


def test_adapt_outlives_the_kernel_grows_and_shrinks(lab):
    from distributed import Client

    name = unique("adapt")
    r = lab.request("POST", "clusters", json={"name": name, "workers": 3})  # max_workers 3
    assert lab.wait_operation(r.json()["operation"]["id"], 240)["state"] == "succeeded"
    try:
        lab.session.put(lab.url + "api/contents/adapt.ipynb", headers=lab.headers(), json={
            "type": "notebook", "content": {"cells": [], "metadata": {}, "nbformat": 4,
                                            "nbformat_minor": 5}}).raise_for_status()
        with running_kernel(lab, "adapt.ipynb") as k:
            out = k.run(f"from jupyter_cloudtik import Cluster\n"
                        f"print(Cluster('{name}').adapt(minimum=1, maximum=3))")
            assert "'maximum': 3" in out
        # the kernel is gone; the server shrinks the idle cluster to its minimum
        assert lab.get(f"clusters/{name}/adapt").json()["adaptive"]["minimum"] == 1
        wait_for(lab, name, 1)
        address = lab.get(f"clusters/{name}").json()["scheduler_address"]
        with Client(address, timeout=30) as c:
            futures = c.map(lambda i: (time.sleep(1.5), i * i)[1], range(40), pure=False)
            wait_for(lab, name, 3, timeout=90)  # the load grows it to its maximum
            assert c.gather(futures) == [i * i for i in range(40)]
            wait_for(lab, name, 1, timeout=90)  # idle again: back to the minimum
            assert c.submit(lambda: 7).result(timeout=60) == 7
        r = lab.request("DELETE", f"clusters/{name}/adapt")
        assert r.status_code == 200 and r.json()["adaptive"] is None
    finally:
        r = lab.request("DELETE", f"clusters/{name}")
        if r.status_code == 202:
            lab.wait_operation(r.json()["operation"]["id"])


@pytest.mark.parametrize("body,field,text", [
    ({"minimum": 3, "maximum": 1}, "minimum", "3 is more than maximum (1)"),
    ({"minimum": -1, "maximum": 1}, "minimum", "-1"),
    ({"minimum": 1, "maximum": 50}, "maximum", "max_workers"),
    ({"minimum": 1}, "body", "'maximum' is a required property"),
])
def test_bad_bounds_name_the_value_and_the_limit(lab, body, field, text):
    name = unique("adaptbad")
    r = lab.request("POST", "clusters", json={"name": name, "workers": 0})
    assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
    try:
        r = lab.request("PUT", f"clusters/{name}/adapt", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["field"] == field and text in r.json()["message"], r.json()
        assert lab.get(f"clusters/{name}/adapt").json()["adaptive"] is None  # nothing changed
    finally:
        r = lab.request("DELETE", f"clusters/{name}")
        if r.status_code == 202:
            lab.wait_operation(r.json()["operation"]["id"])
    r = lab.request("PUT", f"clusters/{name}/adapt", json={"minimum": 0, "maximum": 0})
    assert r.status_code == 409 and "stopped" in r.json()["message"]


def test_adaptive_from_the_cluster_config(lab):
    name = unique("adaptcfg")
    config = {"cluster_name": name, "adaptive": {"minimum": 0, "maximum": 1, "wait_count": 2}}
    r = lab.request("POST", "clusters", json={"config": config, "workers": 1})
    assert r.status_code == 202, r.text
    try:
        assert lab.wait_operation(r.json()["operation"]["id"])["state"] == "succeeded"
        deadline = time.monotonic() + 30
        spec = None
        while spec is None and time.monotonic() < deadline:
            spec = lab.get(f"clusters/{name}/adapt").json()["adaptive"]
            time.sleep(0.3)
        assert spec and (spec["minimum"], spec["maximum"], spec["wait_count"]) == (0, 1, 2)
        wait_for(lab, name, 0, timeout=60)  # idle: down to its minimum
    finally:
        r = lab.request("DELETE", f"clusters/{name}")
        if r.status_code == 202:
            lab.wait_operation(r.json()["operation"]["id"])


def test_adaptive_config_is_checked_by_the_schema(lab):
    r = lab.request("POST", "clusters", json={"config": {
        "cluster_name": unique("adaptbadcfg"), "adaptive": {"minimum": 1}}})
    assert r.status_code == 400 and "maximum" in r.json()["message"], r.text
