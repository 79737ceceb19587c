"""Results land in the output location: copied by the job itself when the system reaches
it, or by the session after the job when it does not."""

from __future__ import annotations

from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import CLIENT_SECRET


def test_output_location_the_system_reaches_is_written_by_the_job(make_client, notebooks,
                                                                  tmp_path):
    client = make_client({"local": {"type": "local"}})
    out = tmp_path / "results"
    info = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 2},
                                    inputs=[str(notebooks["data"])], output=str(out),
                                    outputs=["*.txt"]), "local")
    plan = client.manager._row(info.id)["plan"]
    assert '"stage_out":"' in plan and '"output_via_session":null' in plan
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    assert sorted(p.name for p in out.iterdir()) == ["param.out.ipynb", "result.txt"]
    assert (out / "result.txt").read_text() == "12"
    assert "cp -R" in client.read_file(info.id, "job.sh").decode()


def test_output_location_beyond_the_system_is_copied_by_the_session(make_client,
                                                                    backend_configs,
                                                                    notebooks, tmp_path):
    config, _ = backend_configs["firecrest"]()
    client = make_client({"f7t": config}, {("f7t", "client_secret"): CLIENT_SECRET})
    out = tmp_path / "from-firecrest"
    info = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 5},
                                    inputs=[str(notebooks["data"])], output=str(out)), "f7t")
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    assert (out / "result.txt").read_text() == "30"
    assert (out / "param.out.ipynb").exists()
    messages = [e.message for e in client.events(info.id) if e.step == "stage-out"]
    assert messages[-1] == f"results are in {out}"
