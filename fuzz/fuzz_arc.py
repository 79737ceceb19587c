"""What an ARC CE (A-REX REST) answers, as the arc backend (hpc/arc.py) reads it: the
``GET /info`` document (GLUE2 as JSON; the queues and their limits) and the answers to bulk
job actions (``status``, ``info``: state, exit code, errors).  The CE is another party's
server; its JSON may have any shape.

Properties: any JSON document gives limits (numbers, never negative), one answer per job id
in order, and a job status whose state is one of ours, or ``BackendUnavailable`` (the CE
said it cannot answer) — never another exception.
"""

from __future__ import annotations

import json

from _harness import choose, instrumented, main, output

with instrumented():
    from jupyter_cloudtik.core.errors import BackendUnavailable
    from jupyter_cloudtik.hpc.arc import (
        add_info,
        answers_by_id,
        limits_from_info,
        status_from_answer,
    )
    from jupyter_cloudtik.hpc.base import STATES, Limits

IDS = ["a1", "b2", "c3"]


def one(data: bytes) -> None:
    which, rest = choose(data, 2)
    try:
        doc = json.loads(output(rest))
    except (ValueError, RecursionError):  # _Rest.call reads what is not JSON as None
        doc = None
    if which == 0:
        lim = Limits()
        limits_from_info(lim, doc or {}, None)
        assert lim.default_queue is None or lim.default_queue in lim.queues
        for q in lim.per_queue.values():
            for v in (q.max_nodes, q.max_cpus_per_node, q.max_memory_per_node,
                      q.max_duration):
                assert v is None or v >= 0, v
        return
    answers = answers_by_id(doc, IDS)
    assert len(answers) == len(IDS)
    for jid, ans in zip(IDS, answers, strict=True):
        try:
            st, more = status_from_answer(jid, ans)
        except BackendUnavailable:
            continue
        assert st.state in STATES, st.state
        if more:
            add_info(st, ans)
            assert st.exit_code is None or isinstance(st.exit_code, int)


if __name__ == "__main__":
    main(one)
