"""The notebook's progress widget: one compact line per operation (title, bar, step,
ticking time, a details toggle), the real ipywidgets classes driven by a real operation's
events (issue 28.5)."""

from __future__ import annotations

import time

import pytest

from jupyter_cloudtik.progress import WidgetProgress, follow


def test_one_compact_line_with_details_behind_a_toggle(backend, monkeypatch):
    monkeypatch.setattr(WidgetProgress, "TICK_SECONDS", 0.05)
    view = WidgetProgress("cluster w: up")
    op_id = backend.start_up(name="w", workers=1)
    follow(backend, op_id, view)
    line, details = view.box.children
    assert "cloudtik-progress" in view.box._dom_classes
    assert [type(c).__name__ for c in line.children] == [
        "HTML", "FloatProgress", "HTML", "HTML", "ToggleButton"]
    assert view.bar.value == 1.0 and view.bar.bar_style == "success"
    assert view.step.value == "done" and view.elapsed.value.endswith("s")
    # every step is kept, but hidden until asked for
    assert details.layout.display == "none" and len(view.messages) >= 4
    assert any(m.startswith("ready:") for m in view.messages), view.messages
    view.toggle.value = True
    assert details.layout.display == ""
    view.toggle.value = False
    assert details.layout.display == "none"
    # the clock stopped with the operation
    said = view.elapsed.value
    time.sleep(0.2)
    assert view.elapsed.value == said and not view._ticker.is_alive()
    backend.wait(backend.start_down("w"))


def test_a_failure_turns_it_red_and_leaves_the_message_to_the_error(backend):
    view = WidgetProgress("cluster bad: up")
    op_id = backend.start_up(name="bad", workers=1,
                             config={"setup_commands": ["echo boom; exit 3"]})
    with pytest.raises(Exception) as e:
        follow(backend, op_id, view)
    assert "exited with code 3" in str(e.value)
    assert view.bar.bar_style == "danger" and view.step.value == "<b>failed</b>"
    assert "exited with code 3" not in view.step.value  # said by the error, once
    assert any("exited with code 3" in m for m in view.messages)  # ...and in the details
    backend.wait(backend.start_down("bad"))
