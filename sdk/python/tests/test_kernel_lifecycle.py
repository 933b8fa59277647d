"""What happens to a kernel that dies, and requests a context must refuse
(issue 14), through the synchronous API against a real server."""

from __future__ import annotations

import pytest

from pandastack import ConflictError, InvalidRequestError

pytestmark = pytest.mark.code_interpreter


def test_dead_kernel_restarts_on_next_run(code_sandbox):
    c = code_sandbox.create_code_context()
    try:
        assert c.auto_restart is True
        c.run_code("lost = 1")
        died = c.run_code("import os\nos._exit(1)")
        assert died.error is not None and died.error.name == "KernelDied", died.error
        restarted = c.run_code("lost")
        assert restarted.error is not None and restarted.error.name == "KernelRestarted", restarted.error
        assert "not run" in restarted.error.value
        after = c.run_code("lost")
        assert after.error is not None and after.error.name == "NameError"
        assert c.run_code("6 * 7").text == "42"
    finally:
        c.close()


def test_auto_restart_false_keeps_todays_behaviour(code_sandbox):
    c = code_sandbox.create_code_context(auto_restart=False)
    try:
        assert c.auto_restart is False
        died = c.run_code("import os\nos._exit(1)")
        assert died.error is not None and died.error.name == "KernelDied"
        with pytest.raises(ConflictError):
            c.run_code("1")
        c.restart()
        assert c.run_code("1 + 1").text == "2"
    finally:
        c.close()


def test_language_must_match_the_context(code_sandbox):
    c = code_sandbox.create_code_context()
    try:
        with pytest.raises(InvalidRequestError) as ei:
            code_sandbox.run_code("console.log(1)", language="javascript", context=c)
        assert ei.value.status == 400 and "python" in ei.value.message
        assert code_sandbox.run_code("1 + 2", language="python", context=c).text == "3"
        assert code_sandbox.run_code("1 + 3", context=c).text == "4"
    finally:
        c.close()


def test_cwd_the_user_cannot_enter(code_sandbox):
    with pytest.raises(InvalidRequestError) as ei:
        code_sandbox.create_code_context(cwd="/root")
    assert ei.value.status == 400 and "permission denied" in ei.value.message




def test_first_cell_of_a_fresh_sandbox_counts_one(server):
    from pandastack import Sandbox

    sb = Sandbox.create(template="code-interpreter", ttl_seconds=300)
    try:
        ex = sb.run_code("6 * 7")
        assert ex.text == "42" and ex.execution_count == 1, ex
    finally:
        sb.kill()


def test_kill_during_a_run_says_killed(server):
    import threading

    from pandastack import NotFoundError, PandaStackError, Sandbox

    sb = Sandbox.create(template="code-interpreter", ttl_seconds=300)
    started = threading.Event()
    outcome = {}

    def run():
        try:
            outcome["ex"] = sb.run_code(
                "print('go', flush=True)\nimport time\ntime.sleep(120)", on_stdout=lambda _: started.set(), timeout=300
            )
        except PandaStackError as e:
            outcome["err"] = e
        finally:
            started.set()

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(120)
    Sandbox.connect(sb.id).kill()
    t.join(120)
    assert "err" in outcome, outcome
    assert "killed" in str(outcome["err"]), outcome["err"]
    try:
        sb.refresh()
        assert (sb.state, sb.stop_reason) == ("stopped", "killed")
    except NotFoundError:
        pass
