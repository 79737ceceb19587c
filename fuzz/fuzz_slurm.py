"""What Slurm's commands answer, as the HPC backend (hpc/slurm.py) and the Slurm cluster
provider (providers/slurm_parse.py) read it: ``squeue``, ``sacct``, ``sinfo`` and
``scontrol show partition|node -o`` output, and the cluster tags in a job's ``--comment``.

Properties: output of any shape is read without an exception (lines that do not parse are
skipped: a site's odd ``MaxNodes`` or ``CPUTot`` must not break ``%hpc limits`` or a
cluster's scaling); the limits read are numbers, never negative; the tags written into a
comment read back the same (``decode(encode(tags)) == tags``), also through a whole squeue
line.
"""

from __future__ import annotations

import atheris
from _harness import choose, instrumented, main, output

with instrumented():
    from jupyter_cloudtik.hpc.base import STATES, Limits
    from jupyter_cloudtik.hpc.slurm import (
        common_state,
        limits_from_scontrol,
        parse_sacct_states,
        parse_squeue_states,
    )
    from jupyter_cloudtik.providers.base import (
        TAG_CLUSTER_NAME,
        TAG_LAUNCH_CONFIG,
        TAG_NODE_KIND,
        TAG_NODE_TYPE,
    )
    from jupyter_cloudtik.providers.slurm_parse import (
        decode_comment,
        encode_comment,
        free_memory,
        memory_per_core,
        parse_sacct_job,
        parse_sinfo,
        parse_squeue_jobs,
        sinfo_cpus,
    )
    from jupyter_cloudtik.transport.slurm import parse_kv

TAGS = (TAG_CLUSTER_NAME, TAG_NODE_KIND, TAG_NODE_TYPE, TAG_LAUNCH_CONFIG)


def _limits(data: bytes) -> None:
    part_bytes, _, node_bytes = data.partition(b"\0")  # partitions NUL nodes
    partitions, nodes = output(part_bytes), output(node_bytes)
    lim = Limits()
    default = limits_from_scontrol(lim, partitions, nodes)
    assert default is None or default in lim.queues
    for q in lim.per_queue.values():
        for v in (q.max_nodes, q.max_cpus_per_node, q.max_memory_per_node, q.max_duration):
            assert v is None or (isinstance(v, (int, float)) and v >= 0), (v, partitions)
    rows = [parse_kv(line) for line in nodes.splitlines()]
    per_core = memory_per_core(rows)
    assert per_core is None or per_core >= 0
    assert free_memory(rows) >= 0


def _states(data: bytes) -> None:
    out = output(data)
    seen = parse_squeue_states(out)
    for state, _why in seen.values():
        assert common_state(state) in STATES
    ids = list(seen)[:5]
    for state, _why, rc in parse_sacct_states(out, ids).values():
        assert common_state(state) in STATES
        assert rc is None or rc >= 0
    parse_sacct_job(out, ids[0] if ids else "1")
    for row in parse_sinfo(out):
        assert isinstance(row["default"], bool)
        counts = sinfo_cpus(row["cpus"])
        assert counts is None or all(c >= 0 for c in counts)
    parse_squeue_jobs(out, "ns", "c")


def _comment(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    ns = fdp.ConsumeUnicodeNoSurrogates(8)
    tags = {t: fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 20)) for t in TAGS}
    comment = encode_comment(ns, tags)
    assert "\n" not in comment and "\r" not in comment, comment
    back = decode_comment(comment)
    assert back == {"ns": ns, **tags}, (tags, back)
    # through squeue: the comment is the last of 7 |-separated fields
    line = "|".join(["42", "RUNNING", "n1", "1:00", "2:00", "None", comment])
    jobs = parse_squeue_jobs(f"{line}\n", ns, tags[TAG_CLUSTER_NAME])
    if ns == ns.strip() and tags[TAG_CLUSTER_NAME] == tags[TAG_CLUSTER_NAME]:
        assert jobs["42"]["tags"] == {"ns": ns, **tags}, (jobs, tags)
    decode_comment(output(fdp.ConsumeBytes(fdp.remaining_bytes())))


def one(data: bytes) -> None:
    which, rest = choose(data, 3)
    (_limits, _states, _comment)[which](rest)


if __name__ == "__main__":
    main(one)
