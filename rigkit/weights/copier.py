"""The weights copier as it travels: one Python file, assembled from its package (templates/weights/copier/,
a module per verb) at ship time.

It must be one file because it runs as `python3 -c "$s"` (in a helper container whose image is the
model's own, on a rig's shell, or from one file on a Windows rig), where no package can be put on a
path first. The file carries each module's source and a finder that imports them as
`rigkit_copier.<module>` from that text, so the modules run as the modules they are (their own
namespaces, relative imports), not as one namespace pasted together.
"""

from __future__ import annotations

import functools

from rigkit.plumbing.render import template_path

PACKAGE = "weights/copier"  # under templates/
IMPORT_NAME = "rigkit_copier"

LOADER = '''
class _Sources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports rigkit_copier and its modules from SOURCES."""

    def find_spec(self, name, path=None, target=None):
        package, _, module = name.partition(".")
        if package == "rigkit_copier" and (module or "__init__") in SOURCES:
            return importlib.util.spec_from_loader(name, self, is_package=not module)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        part = module.__name__.partition(".")[2] or "__init__"
        exec(compile(SOURCES[part], "copier/" + part + ".py", "exec"), module.__dict__)


sys.meta_path.insert(0, _Sources())

if __name__ == "__main__":
    from rigkit_copier.main import main

    sys.exit(main(sys.argv))
'''


@functools.cache
def copier_source() -> str:
    """The copier as one file: its modules' text, the finder, and main() on the command line's arguments."""
    folder = template_path(f"{PACKAGE}/__init__.py").parent
    sources = {path.stem: path.read_text() for path in sorted(folder.glob("*.py"))}
    table = "".join(f"    {name!r}: {text!r},\n" for name, text in sources.items())
    return ("# rigkit's weights copier, assembled from templates/weights/copier/ by rigkit/weights/copier.py:\n"
            "# read and change those files, not this one.\n"
            "import importlib.abc\nimport importlib.util\nimport sys\n\n"
            f"SOURCES = {{\n{table}}}\n{LOADER}")
