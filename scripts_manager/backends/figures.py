"""`plt.show()` in a sandbox saves each open figure as a PNG under /output, as hosted code interpreters do.

The script's `sitecustomize` (the hook every sandbox installs first on its path) is also a matplotlib backend
(`MPLBACKEND=module://sitecustomize`): drawing is matplotlib's own Agg, and its `show` writes `figure-N.png`
files (the first free numbers) into `$ROCKBOT_OUTPUT_DIR`, then closes the figures. A script pod has no such
hook: its runner writes the same code as a module of its own into the job's folder (`FIGURES_MODULE_SOURCE`,
runner.py). Nothing of matplotlib is imported unless the script imports it, so a script without it costs nothing
and a sandbox without it is unchanged.
"""

FIGURES_BACKEND = "module://sitecustomize"

#: Appended to the sandbox's `sitecustomize`.
FIGURES_HOOK = """
def show(*args, **kwargs):
    from matplotlib import pyplot
    folder = os.environ.get("ROCKBOT_OUTPUT_DIR", ".")
    number = 1
    for figure in map(pyplot.figure, pyplot.get_fignums()):
        while os.path.lexists(os.path.join(folder, f"figure-{number}.png")):
            number += 1
        figure.savefig(os.path.join(folder, f"figure-{number}.png"), format="png")
    pyplot.close("all")


def __getattr__(name):
    if name == "FigureCanvas":  # what matplotlib asks of a backend module first; Agg draws
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        globals()["FigureCanvas"] = FigureCanvasAgg  # it then copies the module's names
        return FigureCanvasAgg
    raise AttributeError(name)
"""

#: The same as a module of its own, for a script pod: its runner writes it into the job's folder (runner.py).
FIGURES_MODULE_SOURCE = "import os\n" + FIGURES_HOOK
