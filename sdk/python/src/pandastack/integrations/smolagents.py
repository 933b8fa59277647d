"""smolagents integration (the SDK's ``smolagents`` extra).

Three ways to run an agent's code in a PandaStack sandbox:

``run_python``
    The recipe's tool, ready to import: a sandbox and one persistent kernel
    are created on its first call and shared by every agent in the process;
    :func:`close` kills them::

        from smolagents import InferenceClientModel, ToolCallingAgent
        from pandastack.integrations.smolagents import close, run_python

        agent = ToolCallingAgent(tools=[run_python], model=InferenceClientModel())
        agent.run("Plot a histogram of 1000 normal samples")
        close()

:class:`PandaStackPythonTool`
    The same tool with a sandbox of its own per instance, so parallel agents
    never share a kernel. With ``chart_images=True`` and its
    :meth:`~PandaStackPythonTool.add_chart_images` as a step callback, the
    charts a step drew go into that step's observation images, where a
    multimodal model sees them.

:class:`PandaStackExecutor`
    A smolagents executor: ``CodeAgent(executor=PandaStackExecutor())`` runs
    the CodeAgent's own action code in the sandbox, tools and state included.

The sandboxes need the ``code-interpreter`` template (or one like it, with
IPython) on the server that ``PANDASTACK_API`` points at, and
``PANDASTACK_API_KEY``.
"""

from __future__ import annotations

import io
import threading
from typing import Any, List, Mapping, Optional

try:
    import PIL.Image
    from smolagents.local_python_executor import CodeOutput
    from smolagents.memory import ActionStep
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.tools import Tool
    from smolagents.utils import AgentError
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"pandastack.integrations.smolagents needs smolagents (>= 1.23): pip install 'smolagents>=1.23,<2' ({e})"
    ) from e

from ..client import Client
from ..models import Execution
from ..sandbox import Sandbox
from ._kernel import (
    CODE_DESCRIPTION,
    DEFAULT_TEMPLATE,
    DEFAULT_TTL_SECONDS,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    SandboxKernel,
    chart_pngs,
    format_execution,
    png_bytes,
)

__all__ = ["run_python", "close", "PandaStackPythonTool", "PandaStackExecutor", "decode_charts"]

# The metadata of the sandbox that the module-level run_python boots, as in
# the recipe: find it with Sandbox.list(metadata=RUN_PYTHON_METADATA).
RUN_PYTHON_METADATA = {"tool": "smolagents-run-python"}


def decode_charts(ex: Execution) -> List["PIL.Image.Image"]:
    """The charts of an Execution as decoded PIL images, in order."""
    images = []
    for b64 in chart_pngs(ex):
        img = PIL.Image.open(io.BytesIO(png_bytes(b64)))
        img.load()
        images.append(img)
    return images


class _ChartCollector:
    """Charts waiting for the end of the agent step that produced them."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._pending: List["PIL.Image.Image"] = []
        self._lock = threading.Lock()

    def collect(self, ex: Execution) -> None:
        if not self.enabled:
            return
        images = decode_charts(ex)
        if images:
            with self._lock:
                self._pending.extend(images)

    def attach(self, memory_step: Any) -> None:
        if not isinstance(memory_step, ActionStep):
            return
        with self._lock:
            images, self._pending = self._pending, []
        if images:
            memory_step.observations_images = list(memory_step.observations_images or []) + images


class PandaStackPythonTool(Tool):
    """The recipe's ``run_python`` tool with a sandbox of its own.

    The sandbox and its Python kernel are created on the first call and kept:
    variables, imports and DataFrames carry over from one call to the next.
    Each instance has its own, so give each agent its own instance. The tool
    returns the recipe's text (see :func:`pandastack.integrations._kernel.format_execution`):
    ``ERROR:`` and the traceback when the code raised, so the agent can fix
    it; else stdout, ``[stderr]``, ``[result]`` and a ``[chart]`` line.

    Args:
        sandbox, sandbox_id: run in this existing sandbox instead of
            booting one, in its default Python context (the one
            ``Sandbox.run_code`` uses) or in ``context_id``; :meth:`close`
            then leaves the sandbox alone.
        template, ttl_seconds, metadata: of the sandbox the tool boots.
        client: the server and key; default from the environment.
        timeout: seconds a call may run before the kernel is interrupted
            (the server's default otherwise); the tool then answers with a
            ``TimeoutError`` and the kernel keeps its state.
        chart_images: collect the charts of each call as PIL images, for
            :meth:`add_chart_images` to put into the step's
            ``observations_images`` (register it with
            ``step_callbacks=[tool.add_chart_images]``).
        name, description: what the model sees; default ``run_python`` and
            the recipe's description.

    The PNGs of the last call are in :attr:`last_execution` either way.
    """

    name = TOOL_NAME
    description = TOOL_DESCRIPTION
    inputs = {"code": {"type": "string", "description": CODE_DESCRIPTION}}
    output_type = "string"

    def __init__(
        self,
        *,
        sandbox: Optional[Sandbox] = None,
        sandbox_id: Optional[str] = None,
        context_id: Optional[str] = None,
        template: str = DEFAULT_TEMPLATE,
        ttl_seconds: Optional[int] = DEFAULT_TTL_SECONDS,
        metadata: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
        timeout: Optional[float] = None,
        chart_images: bool = False,
        name: Optional[str] = None,
        description: Optional[str] = None,
    ) -> None:
        super().__init__()
        if name is not None:
            self.name = name
        if description is not None:
            self.description = description
        self.kernel = SandboxKernel(
            sandbox=sandbox,
            sandbox_id=sandbox_id,
            context_id=context_id,
            template=template,
            ttl_seconds=ttl_seconds,
            metadata=metadata,
            client=client,
            timeout=timeout,
        )
        self._charts = _ChartCollector(chart_images)
        self.last_execution: Optional[Execution] = None

    def forward(self, code: str) -> str:
        ex = self.kernel.run(code)
        self.last_execution = ex
        self._charts.collect(ex)
        return format_execution(ex)

    def add_chart_images(self, memory_step: Any, agent: Any = None) -> None:
        """Step callback: add the charts drawn since the last step to this
        step's ``observations_images``, which smolagents sends to the model
        with the next input. Needs ``chart_images=True``."""
        self._charts.attach(memory_step)

    @property
    def sandbox(self) -> Sandbox:
        """The tool's sandbox (booted now if it was not yet)."""
        return self.kernel.sandbox

    def close(self) -> None:
        """Kill the tool's sandbox; one it was attached to keeps running. A
        later call starts afresh. Idempotent."""
        self.kernel.close()

    def __enter__(self) -> "PandaStackPythonTool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The recipe's tool, ready to import. Creating it makes no request: the
# sandbox boots on the first call.
run_python = PandaStackPythonTool(metadata=RUN_PYTHON_METADATA)


def close() -> None:
    """Tear down ``run_python``'s sandbox and kernel (if they were started).
    A later call of ``run_python`` starts a fresh one."""
    run_python.close()


class PandaStackExecutor(RemotePythonExecutor):
    """Runs a ``CodeAgent``'s action code in a PandaStack sandbox::

        from smolagents import CodeAgent
        from pandastack.integrations.smolagents import PandaStackExecutor

        with CodeAgent(tools=[], model=model, executor=PandaStackExecutor()) as agent:
            agent.run("...")          # leaving the block kills the sandbox

    The code of every step runs in one persistent kernel, so variables carry
    over from step to step (and run to run). The agent's tools are defined in
    the kernel at the start of each run (``send_tools``), its state variables
    are sent in (``send_variables``), and a call of ``final_answer(...)`` in
    the code ends the run with its value. An exception in the code reaches
    the agent as an ``AgentError`` carrying the kernel's traceback, which the
    model reads on its next step. :meth:`cleanup` (or the agent's) kills the
    sandbox.

    Nothing is pip-installed for you: ``additional_imports`` (module names)
    and the tools' requirements (pip names, such as ``pillow`` for ``PIL``)
    are checked against the sandbox, and missing ones are reported through
    the logger; install them with ``executor.sandbox.exec("pip install
    ...")`` when the sandbox may reach a package index, or use a template
    that has them.

    Args:
        additional_imports: packages the code will import (checked, not
            installed).
        logger: a smolagents ``AgentLogger``; default one at INFO level.
        sandbox, sandbox_id, template, ttl_seconds, metadata, client,
            timeout: as for :class:`PandaStackPythonTool`.
        allow_pickle: let ``final_answer`` values that JSON cannot carry come
            back pickled (smolagents' own option; trust the sandbox's code
            first).
        chart_images: keep the PNGs each step drew, for
            :meth:`add_chart_images` as a step callback.
    """

    def __init__(
        self,
        additional_imports: Optional[List[str]] = None,
        logger: Optional[AgentLogger] = None,
        *,
        sandbox: Optional[Sandbox] = None,
        sandbox_id: Optional[str] = None,
        context_id: Optional[str] = None,
        template: str = DEFAULT_TEMPLATE,
        ttl_seconds: Optional[int] = DEFAULT_TTL_SECONDS,
        metadata: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
        timeout: Optional[float] = None,
        allow_pickle: bool = False,
        chart_images: bool = False,
    ) -> None:
        super().__init__(list(additional_imports or []), logger or AgentLogger(level=LogLevel.INFO), allow_pickle)
        self.kernel = SandboxKernel(
            sandbox=sandbox,
            sandbox_id=sandbox_id,
            context_id=context_id,
            template=template,
            ttl_seconds=ttl_seconds,
            metadata=metadata,
            client=client,
            timeout=timeout,
        )
        self._charts = _ChartCollector(chart_images)
        self.last_execution: Optional[Execution] = None
        if self.additional_imports:
            self.installed_packages = self.install_packages(self.additional_imports)

    @property
    def sandbox(self) -> Sandbox:
        """The executor's sandbox (booted now if it was not yet)."""
        return self.kernel.sandbox

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        ex = self.kernel.run(code)
        self.last_execution = ex
        self._charts.collect(ex)
        logs = ex.stdout
        if ex.stderr:
            if logs and not logs.endswith("\n"):
                logs += "\n"
            logs += f"[stderr]\n{ex.stderr}"
        if ex.error:
            if ex.error.name == self.FINAL_ANSWER_EXCEPTION:
                answer = self._deserialize_final_answer(ex.error.value, self.allow_pickle)
                return CodeOutput(output=answer, logs=logs, is_final_answer=True)
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{ex.error}".lstrip("\n"), self.logger)
        return CodeOutput(output=self._main_output(ex), logs=logs, is_final_answer=False)

    @staticmethod
    def _main_output(ex: Execution) -> Any:
        # The value of the cell's last expression: an image as a PIL image
        # (like smolagents' other remote executors), anything else as its text.
        main = ex.main_result
        if main is None:
            return None
        for b64 in (main.png, main.jpeg):
            if b64:
                img = PIL.Image.open(io.BytesIO(png_bytes(b64)))
                img.load()
                return img
        return main.text

    def install_packages(self, additional_imports: List[str]) -> List[str]:
        """Check that the packages are in the sandbox and log those that are
        not. smolagents passes module names (``additional_imports``) and
        pip names (tools' requirements): a name counts as there when it is
        an importable module or an installed distribution."""
        names = sorted({m for m in additional_imports if m and m != "*" and "*" not in m})
        if not names:
            return list(additional_imports)
        check = (
            "def _pandastack_missing(names):\n"
            "    import importlib.metadata as md, importlib.util as u\n"
            "    def there(n):\n"
            "        try:\n"
            "            if u.find_spec(n.split('.')[0]) is not None:\n"
            "                return True\n"
            "        except (ImportError, ValueError):\n"
            "            pass\n"
            "        try:\n"
            "            md.distribution(n)\n"
            "            return True\n"
            "        except md.PackageNotFoundError:\n"
            "            return False\n"
            "    return ','.join(n for n in names if not there(n))\n"
            f"print(_pandastack_missing({names!r}))\n"
            "del _pandastack_missing"
        )
        ex = self.kernel.run(check)
        missing = [m for m in ex.stdout.strip().split(",") if m]
        if ex.error:
            self.logger.log_error(f"could not check the sandbox's packages: {ex.error}")
        elif missing:
            self.logger.log_error(
                f"not installed in the sandbox (template {self.kernel.template!r}): {', '.join(missing)}; "
                "install them with executor.sandbox.exec('pip install ...') if the sandbox may reach a package "
                "index, or use a template that has them"
            )
        return list(additional_imports)

    def add_chart_images(self, memory_step: Any, agent: Any = None) -> None:
        """Step callback: add the charts the step's code drew to its
        ``observations_images``. Needs ``chart_images=True``."""
        self._charts.attach(memory_step)

    def cleanup(self) -> None:
        """Kill the sandbox; one the executor was attached to keeps running."""
        try:
            self.kernel.close()
        except Exception as e:
            self.logger.log_error(f"Error during cleanup: {e}")

    def delete(self) -> None:
        self.cleanup()
