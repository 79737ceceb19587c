"""Checking a large notebook's parameters never stalls the event loop, and never skips
(hpc/notebook_reader.py).

``json.loads`` of a 200 MB notebook holds the GIL for seconds, so a worker thread did not
keep the loop every job, request and kernel call shares running (0.6-1.3 s late).  Over
``READ_APART_BYTES`` the notebook is read by a process of its own; the check itself must
stay the same: a parameter the notebook cannot receive is refused naming it, a notebook
that is not one is refused naming the field, for a job and for a sweep alike.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.hpc.api import Job
from jupyter_cloudtik.hpc.notebook_reader import READ_APART_BYTES

from .conftest import _nb
from .test_hpc_provenance_loop import _lag

PAD_CELLS = 120_000  # cells with 20 lines of output each: about 45 MB, many small objects
# seconds the loop may be late: parsed in a worker thread it was late by about the whole
# check (2.14 s of a 2.65 s check, quiet); off the loop, by scheduling noise only (0.43 s
# once in a 4 s check with the 2 cores saturated by the CI's four workers)
LAG_FLOOR = 0.5
LAG_SHARE = 0.25  # of the check's duration


def _big(tmp_path):
    nb = _nb(("alpha = 1", ["parameters"]), ("print(alpha)", []))
    nb["cells"] += [{"cell_type": "code", "id": f"o{i}", "metadata": {},
                     "execution_count": 1, "source": "print(i)",
                     "outputs": [{"output_type": "stream", "name": "stdout",
                                  "text": [f"line {j}\n" for j in range(20)]}]}
                    for i in range(PAD_CELLS)]
    path = tmp_path / "big.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.slow
def test_a_large_notebooks_check_keeps_the_loop_running_and_still_refuses(make_client,
                                                                         tmp_path):
    big = _big(tmp_path)
    c = make_client({"here": {"type": "local"}})
    loop = c.runner.loop
    stop = asyncio.Event()
    lag = asyncio.run_coroutine_threadsafe(_lag(stop), loop)
    time.sleep(0.2)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        Job.submit(str(big), backend="here", parameters={"beta": 2}, client=c)
    took = time.monotonic() - t0
    loop.call_soon_threadsafe(stop.set)
    worst = lag.result(timeout=30)
    assert e.value.field == "parameters.beta", e.value.message
    assert "assigns: alpha" in e.value.message, e.value.message
    bound = max(LAG_FLOOR, LAG_SHARE * took)
    assert took > 2 * LAG_FLOOR, f"the check took {took:.2f} s: too small to tell"
    assert worst < bound, (f"the loop stalled {worst:.2f} s during a {took:.2f} s check "
                           f"(bound {bound:.2f} s)")
    # a sweep is checked the same way, every element before anything is recorded
    with pytest.raises(ConfigError) as e:
        Job.sweep(str(big), backend="here", grid={"alpha": [1, 2], "beta": [3]}, client=c)
    assert "beta" in str(e.value.field) and "assigns: alpha" in e.value.message, e.value
    assert c.list() == []


def test_a_large_file_that_is_not_a_notebook_is_refused_by_the_reader(make_client,
                                                                      tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_bytes(b"{" + b" " * (READ_APART_BYTES + 10))
    c = make_client({"here": {"type": "local"}})
    with pytest.raises(ConfigError) as e:
        Job.submit(str(bad), backend="here", parameters={"alpha": 2}, client=c)
    assert e.value.field == "notebook" and "is not a notebook (not JSON" in e.value.message
    wrong = tmp_path / "wrong.ipynb"
    wrong.write_text(json.dumps({"cells": "x" * (READ_APART_BYTES + 10), "nbformat": 4}))
    with pytest.raises(ConfigError) as e:
        Job.submit(str(wrong), backend="here", parameters={"alpha": 2}, client=c)
    assert e.value.field == "notebook" and "version-4 notebook" in e.value.message
    assert c.list() == []


def _executed(cells: int) -> bytes:
    """An executed notebook of ``cells`` small output cells, recording ``loss`` (scrapbook's
    JSON encoding) near the start and ``loss`` again, with ``epochs``, at the end."""
    scrap = "application/scrapbook.scrap.json+json"

    def glued(name, value):
        return {"cell_type": "code", "id": f"g{name}{value}", "metadata": {},
                "execution_count": 1, "source": "glue()", "outputs": [{
                    "output_type": "display_data", "metadata": {},
                    "data": {scrap: {"name": name, "data": value, "encoder": "json",
                                     "version": 1}}}]}

    pad = [{"cell_type": "code", "id": f"o{i}", "metadata": {}, "execution_count": 1,
            "source": "x", "outputs": [{"output_type": "stream", "name": "stdout",
                                        "text": [f"{j}\n" for j in range(20)]}]}
           for i in range(cells)]
    nb = {"cells": [glued("loss", 0.9), *pad, glued("loss", 0.1), glued("epochs", 3)],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb).encode()


def test_a_sweeps_results_read_large_notebooks_off_the_loop():
    """A results table reads up to 16 MiB of each element's executed notebook; parsed in
    a worker thread, json.loads held the GIL — and the loop — for the whole parse (0.7 s
    for this 15 MiB of small cells on this machine).  Read apart, the loop keeps time and
    the values are the same."""
    from jupyter_cloudtik.hpc.notebook_reader import RECORDED_APART_BYTES, recorded_values
    from jupyter_cloudtik.hpc.recording import read_recorded
    from jupyter_cloudtik.hpc.sweep_results import RESULTS_NOTEBOOK_MAX

    data = _executed(52_000)
    assert RECORDED_APART_BYTES < len(data) < RESULTS_NOTEBOOK_MAX
    t0 = time.monotonic()
    expected = read_recorded(data)
    parse = time.monotonic() - t0
    assert expected == {"loss": 0.1, "epochs": 3}

    async def main():
        stop = asyncio.Event()
        lag = asyncio.create_task(_lag(stop))
        await asyncio.sleep(0.1)
        got = await recorded_values(data)
        stop.set()
        return got, await lag

    got, worst = asyncio.run(main())
    assert got == expected
    # in a worker thread the loop is late by about the whole parse; apart, by noise
    bound = max(LAG_FLOOR, 0.6 * parse)
    assert parse > LAG_FLOOR, f"the parse took {parse:.2f} s: too small to tell"
    assert worst < bound, f"the loop stalled {worst:.2f} s (a parse takes {parse:.2f} s)"
    # a small one is read in a thread, with the same answer; not a notebook: no values
    assert asyncio.run(recorded_values(_executed(10))) == expected
    assert asyncio.run(recorded_values(b"[" * (RECORDED_APART_BYTES + 10))) == {}
    assert asyncio.run(recorded_values(b"[" * 100_000)) == {}
