"""The user's recipe (shared/seed: "smolagents secure code execution with
PandaStack"), run unchanged against the real server.

Between the two marker lines below is the recipe's code, copied verbatim
from the seed file, imports and the smolagents @tool decorator included.
The tests call the tool the way smolagents' agent loop does: the @tool
object's __call__ with keyword arguments.
"""


import base64
import struct

import pytest

from pandastack import NotFoundError

pytestmark = pytest.mark.code_interpreter

# ----- recipe: verbatim from the seed file ----------------------------------
from smolagents import tool
from pandastack import Sandbox, CodeContext

_ctx: CodeContext | None = None

def _kernel() -> CodeContext:
    """Lazily create one persistent sandbox kernel for the whole session."""
    global _ctx
    if _ctx is None:
        sandbox = Sandbox.create(
            template="code-interpreter",
            ttl_seconds=3600,
            metadata={"tool": "smolagents-run-python"},
        )
        _ctx = sandbox.create_code_context(language="python")
    return _ctx


@tool
def run_python(code: str) -> str:
    """
    Execute Python in a secure, isolated sandbox kernel and return its output.
    State (variables, imports, DataFrames) persists across calls within this
    session, so build up your analysis incrementally. Use matplotlib/plotly
    normally — charts are captured automatically; do not savefig or write files.

    Args:
        code: The Python source to execute in the sandbox.
    """
    ex = _kernel().run_code(code)

    # Hand the agent everything it needs to self-correct.
    if ex.error:
        return f"ERROR:\n{ex.error}\n\nstdout:\n{ex.stdout}".strip()

    parts = []
    if ex.stdout:
        parts.append(ex.stdout.rstrip())
    if ex.stderr:
        parts.append(f"[stderr]\n{ex.stderr.rstrip()}")
    if ex.text and ex.text not in (ex.stdout or ""):
        parts.append(f"[result] {ex.text}")
    if ex.png:
        # A chart came back as a base64 PNG object — not stdout to parse.
        parts.append("[chart] PNG produced (available as ex.png on the Execution)")

    return "\n\n".join(parts) or "(no output)"
# ----- end of the recipe's code ---------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def recipe_session(server):
    """Reset the recipe's global kernel, and kill its sandbox at the end (the
    recipe leaves it to its TTL)."""
    from conftest import require_code_interpreter

    require_code_interpreter(server)
    global _ctx
    _ctx = None
    yield
    if _ctx is not None:
        _ctx.sandbox.kill()
        _ctx = None


def test_tool_is_a_smolagents_tool():
    from smolagents import Tool

    assert isinstance(run_python, Tool)
    assert run_python.name == "run_python"
    assert run_python.inputs["code"]["type"] == "string"
    assert run_python.output_type == "string"


def test_kernel_is_lazy_and_reused():
    assert _ctx is None  # importing the module started nothing
    k = _kernel()
    assert k is _kernel()
    assert k.sandbox.template == "code-interpreter"
    assert k.sandbox.metadata == {"tool": "smolagents-run-python"}
    assert [s.id for s in Sandbox.list(metadata={"tool": "smolagents-run-python"})] == [k.sandbox.id]


def test_state_persists_between_calls():
    out = run_python(code="import numpy as np\nsamples = np.arange(10) * 2\nprint('defined')")
    assert out == "defined"
    out = run_python(code="print(samples.sum())\nfloat(samples.mean())")
    assert out == "90\n\n[result] 9.0"
    assert run_python(code="x = 1") == "(no output)"


def test_exception_returns_error_with_traceback():
    out = run_python(code="print('partial')\n{}['missing']")
    assert out.startswith("ERROR:\n")
    assert "KeyError" in out and "missing" in out
    assert out.endswith("stdout:\npartial")
    out = run_python(code="undefined_name + 1")
    assert out.startswith("ERROR:") and "NameError" in out and "undefined_name" in out
    # the kernel survives its errors
    assert run_python(code="int(samples.max())") == "[result] 18"


def test_stderr_is_reported():
    out = run_python(code="import sys\nprint('careful', file=sys.stderr)")
    assert out == "[stderr]\ncareful"


def test_chart_marker_and_png():
    out = run_python(code="import matplotlib.pyplot as plt\nplt.hist(samples)\nplt.show()")
    assert "[chart] PNG produced" in out
    # The recipe's "Surfacing the chart back to the model" snippet, verbatim:
    ex = _kernel().run_code(
        "import matplotlib.pyplot as plt; plt.plot([1, 2, 3]); plt.show()"
    )
    chart_b64 = ex.png   # base64 PNG object — no savefig, no file written
    raw = base64.b64decode(chart_b64)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    assert width > 100 and height > 100
    try:  # Pillow comes with smolagents: decode the whole image too
        import io

        from PIL import Image
    except ImportError:
        return
    img = Image.open(io.BytesIO(raw))
    img.load()
    assert img.size == (width, height)


def test_dataframe_html_in_results():
    ex = _kernel().run_code("import pandas as pd\npd.DataFrame({'n': [1, 2, 3]})")
    tables = [r.html for r in ex.results if r.html]
    assert tables and "<table" in tables[0]


def test_cleanup_snippet():
    global _ctx
    ctx = _kernel()
    sandbox = ctx.sandbox
    # The recipe's cleanup, verbatim:
    if _ctx is not None:
        _ctx.close()        # tears down the lazily-created kernel held by the _ctx global
    assert ctx.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(NotFoundError):
        ctx.run_code("1")
    sandbox.kill()
    _ctx = None
