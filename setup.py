"""The workflow's files go inside the package (esmshard/workflow_files), so that an installed
esmshard runs its own workflow from any folder (`esmshard run`, esmshard/commands/launch.py). They keep
the repository's layout, so that the rules' relative paths hold in both places."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# What a deployed workflow fetches as well: the version is read from esmshard/version.py.
WORKFLOW_FILES = ["Snakefile", "workflow", "config", "profiles", "envs", "esmshard/version.py"]


class BuildWithWorkflow(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install runs the clone's own files
            return
        target = Path(self.build_lib) / "esmshard" / "workflow_files"
        for name in WORKFLOW_FILES:
            source = Path(name)
            (target / source).parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(
                    source,
                    target / source,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                )
            else:
                shutil.copy2(source, target / source)


setup(cmdclass={"build_py": BuildWithWorkflow})
