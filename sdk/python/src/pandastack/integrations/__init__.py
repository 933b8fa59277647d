"""Agent-framework integrations: PandaStack sandboxes as the code-running
tool (or executor) of an agent.

Each framework has its own module, imported on demand, so ``import
pandastack`` never imports a framework:

- :mod:`pandastack.integrations.smolagents` (the ``smolagents`` extra):
  the ``run_python`` tool of the recipe,
  :class:`~pandastack.integrations.smolagents.PandaStackPythonTool` (one
  sandbox per instance, charts as observation images) and
  :class:`~pandastack.integrations.smolagents.PandaStackExecutor` for
  ``CodeAgent(executor=...)``.
- :mod:`pandastack.integrations.langchain` (the ``langchain`` extra): a
  LangChain tool for LangGraph agents; charts come back as its artifact.
- :mod:`pandastack.integrations.crewai` (the ``crewai`` extra): a CrewAI
  tool, persistent by default, or attached to an existing sandbox.

All of them answer with the same text: ``ERROR:`` and the traceback when
the code raised, else its stdout, a ``[stderr]`` block, ``[result] <value
of the last expression>`` and a ``[chart]`` line when a chart was drawn.
"""

from ._kernel import SandboxLostError

__all__ = ["SandboxLostError"]
