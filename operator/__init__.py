"""The kopf operator: reconciles Agents, Tools and ScheduledTasks into Kubernetes objects.

This folder imports as `rockbot.operator`. When Python runs with the repository's root first on `sys.path`
(`python3 -m venv .venv` or `python3 -m pytest` there), the interpreter's own start-up imports it as the
standard library's `operator`: then it is that module, run from the standard library's source, so every
command works from the root and not only with `PYTHONSAFEPATH=1`.
"""

if __name__ == "operator":
    import os as _os

    _stdlib_operator = _os.path.join(_os.path.dirname(_os.__file__), "operator.py")
    with open(_stdlib_operator, encoding="utf-8") as _source:
        exec(compile(_source.read(), _stdlib_operator, "exec"))
